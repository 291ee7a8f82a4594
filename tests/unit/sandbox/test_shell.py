"""The shell tool's read-back (envs/shell.py ``apply_tree``): a tar from the sandbox is
untrusted data. Only regular files and directories at clean relative paths reach the
workspace; absolute paths, ``..``, links, devices, FIFOs and sparse files are refused and reported; a
malformed stream or a file/directory conflict changes nothing; files the command removed are
removed. And a command's exit status, output and edits come back (a real sandbox)."""

from __future__ import annotations

import io
import tarfile

import pytest

from composer_replication.sandbox.sandbox import Sandbox
from composer_replication.sandbox.shell import apply_tree, run_shell


def _tar(*members: tuple[str, str, bytes | str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE,
                         "chr": tarfile.CHRTYPE, "fifo": tarfile.FIFOTYPE}[kind]  # fmt: skip
            info.linkname = data if isinstance(data, str) else ""
            tar.addfile(info)
    return buf.getvalue()


@pytest.fixture
def ws(tmp_path):
    root = tmp_path / "ws"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("a = 1\n")
    (root / "gone.txt").write_text("x")
    return root


def test_only_regular_files_at_clean_paths_come_back(ws, tmp_path):
    data = _tar(
        (".", "dir", b""), ("./pkg", "dir", b""), ("./pkg/a.py", "file", b"a = 2\n"),
        ("./new/b.txt", "file", b"b"), ("/etc/evil", "file", b"x"), ("../out.txt", "file", b"x"),
        ("./pkg/../../up.txt", "file", b"x"), ("./link", "sym", "/etc/passwd"),
        ("./hard", "hard", str(tmp_path / "victim")), ("./dev", "chr", b""), ("./fifo", "fifo", b""),
    )  # fmt: skip
    changed, refused, error = apply_tree(data, ws, max_depth=24)
    assert error == ""
    assert changed == ["gone.txt", "new/b.txt", "pkg/a.py"]
    assert set(refused) == {"path:/etc/evil", "path:../out.txt", "path:./pkg/../../up.txt",
                            "symlink:link", "hardlink:hard", "special:dev", "special:fifo"}  # fmt: skip
    assert (ws / "pkg" / "a.py").read_text() == "a = 2\n" and (ws / "new" / "b.txt").exists()
    assert not (ws / "gone.txt").exists()
    assert sorted(p.name for p in ws.iterdir()) == ["new", "pkg"]
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "up.txt").exists()


def _sparse_tar(name: str, claimed: int) -> bytes:
    """A tar whose one member is an old-GNU sparse file: 512 bytes stored, ``claimed`` bytes
    long (the rest holes, read back as zeros)."""
    info = tarfile.TarInfo(name)
    info.size = 512
    hdr = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    hdr[156:157] = tarfile.GNUTYPE_SPARSE
    hdr[386:410] = b"%011o\0%011o\0" % (0, 512)  # one stored chunk: offset 0, 512 bytes
    hdr[483:495] = b"%011o\0" % claimed  # the file's real size
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return bytes(hdr) + b"x" * 512 + b"\0" * 1024


def test_a_sparse_member_is_refused_not_inflated(ws):
    """Red-team pass 10: a 2 kB stream claiming a 64 MB sparse file was read back as 64 MB in
    the trainer (and written to the workspace); the claim is unbounded (100 GB costs the same
    2 kB). The read-back's own caps assume a member's bytes are in the stream."""
    data = _sparse_tar("./big.txt", 64 << 20)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # what the attack relies on
        assert [m.size for m in tar] == [64 << 20]
    changed, refused, error = apply_tree(data, ws, max_depth=24)
    assert "sparse:big.txt" in refused
    assert not (ws / "big.txt").exists()


@pytest.mark.parametrize(
    "data, why",
    [
        (b"not a tar at all" * 64, "malformed"),
        (
            _tar(("./pkg", "file", b"x"), ("./pkg/a.py", "file", b"y")),
            "both a file and a directory",
        ),
        (_tar(*[("/".join(["d"] * 30) + "/f", "file", b"x")]), ""),
    ],
)
def test_bad_streams_change_nothing(ws, data, why):
    before = {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()}
    changed, refused, error = apply_tree(data, ws, max_depth=24)
    if why:
        assert why in error and changed == []
        assert {p: p.read_bytes() for p in ws.rglob("*") if p.is_file()} == before
    else:  # too deep: refused, and (the tree holding nothing else) the rest is removed
        assert refused and refused[0].startswith("path:d/d/")


def test_a_command_runs_in_the_sandbox_on_a_copy_of_the_workspace(ws):
    res = run_shell(Sandbox(), ws, "cat pkg/a.py; echo b > pkg/b.py; rm gone.txt; pwd; exit 4", 20)
    assert res.exit_code == 4 and res.output == "a = 1\n/repo\n" and res.error == ""
    assert res.changed == ["gone.txt", "pkg/b.py"] and (ws / "pkg" / "b.py").read_text() == "b\n"
    look = run_shell(Sandbox(), ws, "echo c > c.txt", 20, apply=False)
    assert look.exit_code == 0 and not (ws / "c.txt").exists()
    slow = run_shell(Sandbox(), ws, "echo started; sleep 30", 2)
    assert slow.timed_out and slow.exit_code is None and "started" in slow.output
    assert run_shell(Sandbox(), ws, "x" * 40_000, 5).error.startswith("the command must be")
