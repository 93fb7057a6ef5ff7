"""A folder where no file can be created, for tests of the paragraphs a read-only destination gets."""
import errno
import os


def read_only(tmp_path, monkeypatch):
    """tmp_path/ro, where no file can be created: chmod 555, or for root (whom chmod does not stop) an
    os.open (creating) and os.mkdir that fail inside it as on a read-only mount."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return folder
    real_open, real_mkdir = os.open, os.mkdir

    def refuse_inside(path):
        where = os.path.dirname(os.path.abspath(path))  # a missing parent fails as it would (ENOENT)
        if f"{where}{os.sep}".startswith(f"{folder}{os.sep}") and os.path.isdir(where):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    def open_(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            refuse_inside(path)
        return real_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):
        refuse_inside(path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)
    return folder
