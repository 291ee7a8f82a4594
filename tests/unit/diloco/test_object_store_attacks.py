"""What a peer's object can hold and what rank 0 does with it: every malformed, stale, stray or
diverged contribution stops the round with an error naming its key, never a silently wrong (or
NaN) average on every replica. The peer (rank 1 of 2) is played by writing its object by hand."""

from __future__ import annotations

import io
import threading

import pytest
import torch

from composer_replication.diloco.serverless import ObjectStoreAllReduce, ObjectStorePayloadError
from composer_replication.diloco.serverless.compression import encode


def _peer_object(values, *, codec="none", rank=1, world=2, round_id=0, **override):
    obj = {
        "rank": rank,
        "world_size": world,
        "round": round_id,
        "tensors": [encode(t, codec) for t in values],
    }
    obj.update(override)
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _put(tmp_path, name: str, data: bytes, round_id: int = 0) -> None:
    d = tmp_path / "s" / f"round-{round_id:08d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def _rank0(tmp_path, tensors, codec="none"):
    red = ObjectStoreAllReduce(f"file://{tmp_path}/s", 0, 2, timeout_s=5, compression=codec)
    return red.allreduce(tensors)


def test_an_honest_hand_written_peer_is_averaged(tmp_path):
    """The harness itself: a well-formed peer object gives the exact average."""
    _put(tmp_path, "rank-00001.pt", _peer_object([torch.tensor([3.0, 5.0])]))
    assert _rank0(tmp_path, [torch.tensor([1.0, 1.0])])[0].tolist() == [2.0, 3.0]


@pytest.mark.parametrize(
    "peer, match",
    [
        # zeros(4) + tensor([100.]) used to broadcast to [50]*4 on every replica
        (
            _peer_object([torch.tensor([100.0])]),
            r"tensor 0: shape \[1\], this rank's tensor is \[4\]",
        ),
        (_peer_object([torch.ones(4), torch.ones(4)]), "2 tensors, rank 0 has 1"),
        (_peer_object([torch.tensor([1.0, float("nan"), 0, 0])]), "non-finite"),
        (_peer_object([torch.tensor([1.0, float("inf"), 0, 0])], codec="bf16"), "non-finite"),
        # int8 of a tensor holding inf: scale = inf; of NaN: scale = nan
        (_peer_object([torch.tensor([1.0, float("inf"), 0, 0])], codec="int8"), "int8 scale inf"),
        (_peer_object([torch.tensor([float("nan"), 1.0, 0, 0])], codec="int8"), "int8 scale nan"),
        (_peer_object([torch.ones(4)], round_id=3), "written as .*'round': 3"),
        (_peer_object([torch.ones(4)], rank=0), "written as .*'rank': 0"),
        (_peer_object([torch.ones(4)], world=3), "written as .*'world_size': 3"),
        (_peer_object([torch.ones(4)], extra=1), "not an object this all-reduce writes"),
        (_peer_object([torch.ones(4)], tensors="abc"), "no list of tensors"),
        (b"not a torch file at all", "unreadable"),
    ],
    ids=[
        "shape",
        "count",
        "nan",
        "bf16-inf",
        "int8-inf",
        "int8-nan",
        "stale-round",
        "other-rank",
        "other-world",
        "extra-key",
        "tensors-not-list",
        "garbage",
    ],
)
def test_malformed_peer_is_refused_naming_its_key(tmp_path, peer, match):
    _put(tmp_path, "rank-00001.pt", peer)
    with pytest.raises(ObjectStorePayloadError, match=match) as info:
        _rank0(tmp_path, [torch.zeros(4)])
    assert info.value.key.endswith("round-00000000/rank-00001.pt") and info.value.round_id == 0


@pytest.mark.parametrize(
    "payload, match",
    [
        ({"codec": "fp4", "data": torch.ones(4)}, "codec 'fp4'"),
        ({"codec": "none", "data": torch.ones(4, dtype=torch.float64)}, "float64"),
        ({"codec": "none", "data": [1.0, 2.0, 3.0, 4.0]}, "data is list"),
        ({"codec": "int8", "data": torch.ones(4, dtype=torch.int8)}, "keys"),
        (
            {"codec": "int8", "data": torch.ones(4, dtype=torch.int8), "scale": "1"},
            "scale is a str",
        ),
        (
            {"codec": "int8", "data": torch.ones(4, dtype=torch.int8), "scale": True},
            "scale is a bool",
        ),
        ({"codec": "int8", "data": torch.ones(4, dtype=torch.int8), "scale": -1.0}, "scale -1.0"),
        ({"codec": "none", "data": torch.ones(4), "scale": 2.0}, "keys"),
        ([torch.ones(4)], "a list, not a payload dict"),
    ],
)
def test_malformed_payload_fields(tmp_path, payload, match):
    _put(tmp_path, "rank-00001.pt", _peer_object([torch.ones(4)], tensors=[payload]))
    with pytest.raises(ObjectStorePayloadError, match=match):
        _rank0(tmp_path, [torch.zeros(4)])


def test_oversized_object_is_refused_before_it_is_read(tmp_path):
    big = _peer_object([torch.zeros(1 << 19)])  # 2 MiB of fp32 for a 4-element round
    _put(tmp_path, "rank-00001.pt", big)
    with pytest.raises(ObjectStorePayloadError, match="bytes, more than fp32 tensors"):
        _rank0(tmp_path, [torch.zeros(4)])


@pytest.mark.parametrize("stray", ["rank-abc.pt", "rank-00007.pt", "rank-1.pt", "notes.txt"])
def test_stray_or_leftover_key_is_named(tmp_path, stray):
    """A leftover rank-00007.pt with world 2 used to count toward the round and then fail with
    FileNotFoundError for rank 1; rank-abc.pt raised int('abc')."""
    _put(tmp_path, stray, b"x")
    with pytest.raises(ObjectStorePayloadError, match=f"{stray}: not the key of a rank below"):
        _rank0(tmp_path, [torch.zeros(4)])


def test_a_rank_write_in_progress_is_not_a_stray_key(tmp_path):
    _put(tmp_path, ".tmp-00001-abc", b"partial")
    _put(tmp_path, "rank-00001.pt", _peer_object([torch.tensor([2.0])]))
    assert _rank0(tmp_path, [torch.tensor([4.0])])[0].tolist() == [3.0]


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_a_diverged_rank_stops_every_rank_naming_itself(tmp_path, codec):
    """Rank 1's pseudo-gradient holds NaN: rank 1 writes it (so rank 0 fails at once, not after
    its timeout) and both ranks stop with an error naming rank 1's object."""
    uri = f"file://{tmp_path}/s"
    errs: list = [None, None]

    def run(r):
        t = torch.tensor([1.0, float("nan")]) if r == 1 else torch.ones(2)
        try:
            ObjectStoreAllReduce(uri, r, 2, timeout_s=30, compression=codec).allreduce([t])
        except BaseException as e:  # noqa: BLE001 - checked below
            errs[r] = e

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for e in errs:
        assert isinstance(e, ObjectStorePayloadError), e
        assert e.key.endswith("rank-00001.pt")


def test_world_of_one_refuses_non_finite(tmp_path):
    red = ObjectStoreAllReduce(f"file://{tmp_path}/s", 0, 1)
    with pytest.raises(ObjectStorePayloadError, match="non-finite"):
        red.allreduce([torch.tensor([float("inf")])])


def _payload_object(payload, **override):
    obj = {"rank": 1, "world_size": 2, "round": 0, "tensors": [payload], **override}
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    "data, match",
    [
        (torch.nn.Parameter(torch.ones(4)), "expected a torch.float32 tensor"),
        (torch.ones(4).to_sparse(), "not a dense CPU one"),
    ],
    ids=["parameter-subclass", "sparse"],
)
def test_tensor_kinds_encode_never_writes_are_refused(tmp_path, data, match):
    _put(tmp_path, "rank-00001.pt", _payload_object({"codec": "none", "data": data}))
    with pytest.raises(ObjectStorePayloadError, match=match):
        _rank0(tmp_path, [torch.zeros(4)])


@pytest.mark.parametrize(
    "scale, data, match",
    [
        (-0.0, torch.ones(4, dtype=torch.int8), "scale -0.0 is not positive"),
        (1.0, torch.tensor([-128, 0, 0, 0], dtype=torch.int8), "int8 value -128"),
    ],
)
def test_int8_values_encode_never_writes_are_refused(tmp_path, scale, data, match):
    payload = {"codec": "int8", "data": data, "scale": scale}
    _put(tmp_path, "rank-00001.pt", _payload_object(payload))
    with pytest.raises(ObjectStorePayloadError, match=match):
        _rank0(tmp_path, [torch.zeros(4)], codec="int8")


def test_a_header_value_of_another_type_is_refused(tmp_path):
    payload = encode(torch.ones(4), "none")
    _put(tmp_path, "rank-00001.pt", _payload_object(payload, rank=torch.tensor(1)))
    with pytest.raises(ObjectStorePayloadError, match="written as"):
        _rank0(tmp_path, [torch.zeros(4)])


def test_many_small_tensors_fit_the_size_bound(tmp_path):
    """torch.save spends ~280 bytes per tensor: 5000 tensors of 4 floats (an MoE's unfused
    experts have ~18k) used to exceed a flat 1 MiB allowance."""
    n = 5000
    _put(tmp_path, "rank-00001.pt", _peer_object([torch.ones(4)] * n))
    out = _rank0(tmp_path, [torch.zeros(4)] * n)
    assert len(out) == n and out[-1].tolist() == [0.5] * 4


def test_the_round_directorys_own_marker_is_not_a_stray_key(tmp_path, monkeypatch):
    """s3fs lists a zero-byte `round-.../` folder marker as a child of that folder."""
    red = ObjectStoreAllReduce(f"file://{tmp_path}/s", 0, 2, timeout_s=5)
    real_ls = red.fs.ls

    def ls(path, detail=False):
        return [path.rstrip("/") + "/", *real_ls(path, detail=detail)]

    monkeypatch.setattr(red.fs, "ls", ls)
    _put(tmp_path, "rank-00001.pt", _peer_object([torch.tensor([2.0])]))
    assert red.allreduce([torch.tensor([4.0])])[0].tolist() == [3.0]
