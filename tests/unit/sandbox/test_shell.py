"""The shell tool's read-back (envs/shell.py ``apply_tree``): a tar from the sandbox is
untrusted data. Only regular files and directories at clean relative paths reach the
workspace; absolute paths, ``..``, links, devices, FIFOs and sparse files are refused and reported; a
malformed stream or a file/directory conflict changes nothing; files the command removed are
removed. And a command's exit status, output and edits come back (a real sandbox)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from composer_replication.sandbox import shell
from composer_replication.sandbox.sandbox import Sandbox
from composer_replication.sandbox.shell import WaitCredit, apply_tree, run_shell


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


@pytest.mark.parametrize("max_s", [4.0, 1.0])
def test_time_credited_for_waits_on_the_host_is_not_the_command_s_own(ws, max_s):
    """The host says the command waited 4 s (``WaitCredit``): 3 s of sleep against a 1 s
    limit is 3 - 4 s of its own time, and it finishes; with the credit capped at 1 s it is
    3 - 1 = 2 s and the watchdog kills it inside (what it wrote first still comes back)."""
    credit = WaitCredit(lambda: (4.0, False), max_s)
    try:
        res = run_shell(Sandbox(), ws, "echo a > a.txt; sleep 3; echo b > b.txt", 1, credit=credit)
    finally:
        credit.close()
    assert (Path(credit.dir).exists(), res.error) == (False, "")
    if max_s == 4.0:
        assert res.exit_code == 0 and res.changed == ["a.txt", "b.txt"]
    else:
        assert res.timed_out and res.exit_code is None and res.changed == ["a.txt"]


def test_the_host_kills_a_command_that_stops_the_own_time_watchdog(ws, monkeypatch):
    """The command kills the watchdog (same user inside), then ignores signals and sleeps:
    the host's deadline (4 s, no credit, a 2 s margin) kills the whole sandbox; nothing comes
    back (the watchdog would have let the script copy ``a.txt`` out). The limit leaves the
    command time to kill the watchdog first on a loaded machine (with 1 s the watchdog won
    the race once in CI: timed out by the watchdog, no host error)."""
    monkeypatch.setattr(shell, "COPY_MARGIN_S", 2.0)
    credit = WaitCredit(lambda: (0.0, False), 60.0)
    command = "pkill -KILL -f 'cr-watchdog [0-9]' && echo a > a.txt; trap '' TERM INT HUP; sleep 60"
    try:
        res = run_shell(Sandbox(), ws, command, 4, credit=credit)
    finally:
        credit.close()
    assert res.timed_out and res.exit_code is None and res.changed == []
    assert res.error.startswith("the sandbox ended before")


# ---- all or nothing (issue 55, class 5) ------------------------------------------------------


def _messy(root):
    """A workspace a command's result changes in every way: files removed, rewritten (an
    executable keeps its mode), a directory becoming a file and a file a directory, a link
    removed, new directories."""
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("a = 1\n")
    (root / "pkg" / "sub" / "x.txt").write_text("x\n")
    (root / "run.sh").write_text("echo 1\n")
    (root / "run.sh").chmod(0o755)
    (root / "same.txt").write_text("same\n")
    (root / "becomes_dir").write_text("file\n")
    (root / "gone").mkdir()
    (root / "gone" / "g.txt").write_text("g\n")
    (root / "link").symlink_to("/etc/hostname")
    return _tar(
        ("./pkg", "dir", b""), ("./pkg/a.py", "file", b"a = 2\n"), ("./pkg/sub", "file", b"now a file\n"),
        ("./run.sh", "file", b"echo 2\n"), ("./same.txt", "file", b"same\n"),
        ("./becomes_dir/in.txt", "file", b"in\n"), ("./new/deep/n.txt", "file", b"n\n"),
    )  # fmt: skip


def test_a_tree_longer_than_the_hosts_path_max_changes_nothing(ws):
    """Issue 55: ``/repo`` inside the sandbox is shorter than the workspace's real path, so a
    tree that fits there can pass the host's PATH_MAX; the old read-back deleted the removed
    files first and then raised ENAMETOOLONG (the exception aborted the rollout batch)."""
    from support.faults import snapshot

    before = snapshot(ws)
    room = os.pathconf(ws, "PC_PATH_MAX") - len("/repo/") - 16  # fits under /repo, not ws
    deep = "/".join(["d" * 200] * (room // 201)) + "/" + "f" * (room % 201 or 1)
    assert len(f"/repo/{deep}") < os.pathconf(ws, "PC_PATH_MAX") < len(f"{ws}/{deep}")
    changed, refused, error = apply_tree(_tar((f"./{deep}", "file", b"x")), ws, max_depth=64)
    assert "longer than this host allows" in error and changed == []
    assert snapshot(ws) == before


def test_every_sync_survives_a_failure_at_its_kth_change(tmp_path, monkeypatch):
    """Issue 55: the read-back changes the workspace all or nothing. For every k, a failure
    of the k-th write, unlink, rename or mkdir, alone or followed by a failure of any later
    call (the rollback's own), leaves the tree exactly as it was (or, if the failing call came
    after the commit, exactly as wanted), and nothing beside it."""
    from support.faults import every_fault, injected, snapshot

    root = tmp_path / "ws"
    with injected(monkeypatch):  # counted, nothing fails: the tree wanted
        root.mkdir()
        assert apply_tree(_messy(root), root, max_depth=24)[2] == ""
        after = snapshot(root)
    assert after["run.sh"][2] == 0o755 and "link" not in after and "gone" not in after
    shutil.rmtree(root)
    root.mkdir()
    data = _messy(root)
    before = snapshot(root)

    def setup():
        shutil.rmtree(root)
        root.mkdir()
        _messy(root)

    runs = rolled_back = 0
    for failing, faults, (changed, _refused, error) in every_fault(
        setup, lambda: apply_tree(data, root, 24), monkeypatch
    ):
        runs += 1
        assert faults.failed
        if error:
            assert "nothing changed" in error and changed == []
            assert snapshot(root) == before, f"failures at {failing}: half-applied"
            rolled_back += 1
        else:
            assert snapshot(root) == after, f"failures at {failing}"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["ws"], f"failures at {failing}"
    assert runs > 100 and rolled_back > runs // 2


@pytest.mark.parametrize("target", ["victim", "victim_dir", "missing"])
def test_staging_never_follows_a_link(ws, tmp_path, target):
    """Issue 55 (class 9): staging a workspace for the sandbox made it world-readable with
    ``chmod`` through links: a link in the workspace to a file outside made the root grader
    chmod that file 644 (``/etc/shadow`` is one link away), and a dangling link failed the
    command. Links are copied as links and never followed."""
    from composer_replication.sandbox.shell import _stage

    (tmp_path / "victim").write_text("secret\n")
    (tmp_path / "victim").chmod(0o600)
    (tmp_path / "victim_dir").mkdir(mode=0o700)
    (tmp_path / "victim_dir").chmod(0o700)
    (ws / "pkg" / "link").symlink_to(tmp_path / target)
    stage = _stage(ws)
    try:
        assert os.path.islink(os.path.join(stage, "pkg", "link"))
        assert os.stat(os.path.join(stage, "pkg", "a.py")).st_mode & 0o777 == 0o644
    finally:
        shutil.rmtree(stage)
    assert (tmp_path / "victim").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "victim_dir").stat().st_mode & 0o777 == 0o700
