"""Two processes' data dirs sharing uploads as docs/several-processes.md links them: `files` in the second data dir a
link to the first's, made before the first upload made the folder. Uploads to either, at once, never fail."""

from __future__ import annotations

import threading

from serge.store import FileStore


def test_uploads_through_a_files_link_made_before_its_folder_land_in_the_shared_folder(tmp_path):
    a, b = tmp_path / "serge-a", tmp_path / "serge-b"
    a.mkdir()
    b.mkdir()
    (b / "files").symlink_to(a / "files")  # the doc's `ln -s`, before serge-a's first upload
    stores, errors, names = (FileStore(a / "files"), FileStore(b / "files")), [], []
    start = threading.Barrier(8)

    def upload(i: int) -> None:
        try:
            start.wait()
            names.append(stores[i % 2].put(f"file {i % 4}".encode()))  # the same bytes through both, at once
        except Exception as exc:  # the upload's 500 (FileExistsError, once)
            errors.append(exc)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(8)]  # two uploads of each file at once
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert (a / "files").is_dir() and not (a / "files").is_symlink()
    for sha in names:  # each readable through either data dir, by its owner alone
        assert stores[0].path(sha).read_bytes() == stores[1].path(sha).read_bytes()
        assert stores[0].path(sha).stat().st_mode & 0o777 == 0o600
    assert len(set(names)) == 4 and not list((a / "files").rglob("*.part"))
