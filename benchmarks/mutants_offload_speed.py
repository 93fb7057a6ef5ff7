"""Mutants of CPU offload's speed on one GPU (issue 45: shardtrain/trainer/parallel/upload_ahead.py, the upload's
time in trainer/offload_times.py, the gradient norm on the host's cores in trainer/parallel/host_norms.py). Each
mutant was seen to fail its tests."""
from mutant_spec import T, Mutant

UPLOAD = T + "parallel/upload_ahead.py"
NORMS = T + "parallel/host_norms.py"
TIMES = T + "offload_times.py"
U = "tests/trainer/parallel/test_upload_ahead.py::"
ORDER = U + "test_the_next_blocks_copy_is_issued_before_this_blocks_compute_ends"
N = "tests/trainer/parallel/test_host_norms.py::"
O = "tests/trainer/test_offload_times.py::"

MUTANTS = [
    Mutant("upload_not_ahead", "on one GPU block k+1's shards are copied while block k computes", UPLOAD,
           "        self._issue_ahead(i)\n", "", (ORDER,)),
    Mutant("upload_ahead_unbounded", "the shards uploaded ahead are bounded in device memory", UPLOAD,
           "(j == i + 1 or waiting + self.sizes[j] <= self.ahead_bytes)", "True", (ORDER,)),
    Mutant("upload_copy_unused", "FSDP2 computes with the copy uploaded ahead", UPLOAD,
           "            source.source = copy\n", "            pass\n", (ORDER,)),
    Mutant("upload_host_not_restored", "each forward uploads the host shards as the CPU step left them", UPLOAD,
           "            source.source = host\n", "            pass\n",
           (U + "test_the_next_forward_uploads_the_host_shards_as_they_are_then",)),
    Mutant("upload_on_every_mesh", "only a 1-rank shard group uploads ahead (FSDP2's prefetch covers more)", UPLOAD,
           " and mesh.size(mesh.ndim - 1) == 1", "",
           (U + "test_uploads_ahead_only_where_fsdp2_copies_on_the_compute_stream",)),
    Mutant("upload_never_wired", "fully_sharded uploads ahead where it applies", T + "parallel/fsdp_wrap.py",
           "    if uploads_ahead(offload, mesh):", "    if False:",
           (U + "test_apply_fsdp_uploads_ahead_where_it_applies",)),
    Mutant("times_upload_is_the_hooks_on_gpus", "offload_upload is left out where the hook's time is not the copy's",
           TIMES, "self._uploads is not None or _device_type(model) == \"cpu\"", "True",
           (O + "test_upload_is_left_out_on_an_accelerator_without_an_uploader",)),
    Mutant("times_upload_not_the_copies", "offload_upload is the uploader's copies, timed by their events", TIMES,
           "self._uploads() if self._uploads is not None else self.unshards.seconds", "self.unshards.seconds",
           (O + "test_upload_on_an_accelerator_is_the_uploaders_copies",)),
    Mutant("norms_on_one_core", "the gradient norm uses the host's cores", NORMS,
           "    if threads < 2 or len(tensors) < 2", "    if True or len(tensors) < 2",
           (N + "test_the_tensors_norms_spread_over_threads",)),
    Mutant("norms_pool_for_any_size", "a small gradient's norm starts no pool of threads (issue 46: a third of a "
           "small model's update)", NORMS, " or \\\n            sum(t.numel() for t in tensors) < SPREAD_FROM:", ":",
           (N + "test_fewer_elements_than_spread_from_stay_on_this_thread",)),
    Mutant("norms_split_inside_a_tensor", "the gradient norm has today's bits", NORMS,
           "    return torch.linalg.vector_norm(tensor, 2.0)\n",
           "    halves = torch.tensor_split(tensor.flatten(), 2)\n"
           "    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(h) for h in halves]))\n",
           (N + "test_the_norm_has_todays_bits_on_any_number_of_threads",)),
]
