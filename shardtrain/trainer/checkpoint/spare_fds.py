"""Two file descriptors held through a save, so that a save that failed for want of descriptors can still
remove what it began: removing a directory tree opens the directory and a listing of it, and a save stopped
by a full descriptor table (EMFILE) left its ``.partial`` directory behind for that reason."""
import os
import shutil
from typing import List


class SpareDescriptors:
    def __init__(self, count: int = 2):
        """Raises OSError (EMFILE) when even these cannot be had: the save stops before writing anything."""
        self.fds: List[int] = []
        try:
            for _ in range(count):
                self.fds.append(os.open(os.devnull, os.O_RDONLY))
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        while self.fds:
            os.close(self.fds.pop())

    def remove_tree(self, path: str) -> None:
        """Release the spares, then remove ``path`` (what a failed save began)."""
        self.release()
        shutil.rmtree(path, ignore_errors=True)
