"""fp16 dynamic loss scaling: fairseq's policy, as plain state with no tensors.

The loss is multiplied by ``scale`` before backward so small fp16 gradients do
not flush to zero. An update whose gradient holds an inf/NaN is skipped and
the scale divided by ``scale_factor`` (if overflows since the last rescale
reach ``tolerance`` of the updates); after ``scale_window`` clean updates since
the last overflow it is multiplied back. The decision is taken from the
*global* gradient norm, which every backend computes with a collective, so all
ranks see the same norm and skip together.

Why not ``torch.amp.GradScaler``: it checks each rank's own gradients, needs
its own all-reduce of the found-inf flag under sharding, and has no minimum
scale, tolerance or threshold — fairseq users rely on all three.
"""
import logging
from typing import Dict, Optional

from shardtrain.core.errors import ShardtrainError

logger = logging.getLogger(__name__)


class MinimumLossScaleError(ShardtrainError):
    """The loss scale fell to --min-loss-scale: the loss is probably exploding."""


class DynamicLossScaler:
    def __init__(self, init_scale: float = 2.0 ** 7, scale_factor: float = 2.0, scale_window: int = 2000,
                 tolerance: float = 0.0, threshold: Optional[float] = None, min_loss_scale: float = 1e-4,
                 stop_at_min_scale: bool = True):
        self.loss_scale = float(init_scale)
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.tolerance = tolerance
        self.threshold = threshold
        self.min_loss_scale = min_loss_scale
        self.stop_at_min_scale = stop_at_min_scale
        self._iter = 0
        self._last_overflow_iter = -1
        self._last_rescale_iter = -1
        self._overflows_since_rescale = 0

    def update(self) -> None:
        """After a clean update: grow the scale once a window passed without overflow."""
        if (self._iter - self._last_overflow_iter) % self.scale_window == 0:
            self.loss_scale *= self.scale_factor
            self._last_rescale_iter = self._iter
        self._iter += 1

    def overflow(self, update: int) -> None:
        """After an inf/NaN gradient: lower the scale, or stop at the minimum."""
        prev_scale = self.loss_scale
        self._last_overflow_iter = self._iter
        self._overflows_since_rescale += 1
        if self._overflows_since_rescale / float(self._iter - self._last_rescale_iter) >= self.tolerance:
            self.loss_scale /= self.scale_factor
            if self.threshold is not None:
                self.loss_scale = max(self.loss_scale, self.threshold)
            self._last_rescale_iter = self._iter
            self._overflows_since_rescale = 0
        if self.loss_scale <= self.min_loss_scale:
            self.loss_scale = prev_scale
            if self.stop_at_min_scale:
                raise MinimumLossScaleError(
                    f"Minimum loss scale reached ({self.min_loss_scale}) at update {update}: the fp16 gradient "
                    f"overflows even at that scale, so your loss is probably exploding. Try a lower --lr, more "
                    f"--warmup-updates, gradient clipping (--clip-norm), a larger batch, or --bf16 (no loss "
                    f"scaling needed). --fp16-no-stop-at-min-scale keeps training and skips overflowing updates.")
        self._iter += 1
        logger.info(f"gradient overflow detected, ignoring gradient, setting loss scale to: {self.loss_scale}")

    def state_dict(self) -> Dict:
        return {"loss_scale": self.loss_scale, "iter": self._iter, "last_overflow_iter": self._last_overflow_iter,
                "last_rescale_iter": self._last_rescale_iter, "overflows_since_rescale": self._overflows_since_rescale}

    def load_state_dict(self, state: Dict) -> None:
        self.loss_scale = float(state["loss_scale"])
        self._iter = state.get("iter", 0)
        self._last_overflow_iter = state.get("last_overflow_iter", -1)
        self._last_rescale_iter = state.get("last_rescale_iter", -1)
        self._overflows_since_rescale = state.get("overflows_since_rescale", 0)
