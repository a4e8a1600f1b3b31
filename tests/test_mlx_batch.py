"""MLX's batched runtime (targets/mlx_batch.py) on MLX's Linux CPU backend: what the batch
contract (tests/contract/test_batch_contract.py) leaves out.

The ``parallel`` setting checked as llama.cpp's and OpenVINO's are, a quantized KV cache
refused with it, the memory check counting every stream; each request sampling as the
single-stream session does with the same settings (seeds, top-k/p, min-p, a repeat
penalty), whatever else is in the batch; a kept prefix reused (the figures
``SeqStep.cached`` reports) without changing a token, within the memory budget, and
forgotten on request; end-of-sequence, ignore_eos and a full context; refusals, a failed
step, closing; logits while streams run; Gemma 3's sliding-window cache batched, without
reuse. The variants are edgekit's conversions of tiny random models (tests/tiny_models.py).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgekit.errors import GenerationError, InsufficientMemoryError, SettingError
from tests.conftest import require

CONTEXT = 256
N = 16
PROMPTS = (
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "It is a truth universally acknowledged, that a single man in possession",
)
SYSTEM = "You are a terse assistant for a weather service. Answer in one plain sentence."


def _sampling(**settings: Any) -> Any:
    from edgekit.targets.values import Sampling

    return Sampling(**{"max_tokens": N, "temperature": 0.0, "ignore_eos": True, **settings})


def _build(root: Path, family: str, **shape: Any) -> Path:
    require("mlx_lm", "the target runs mlx-lm")
    require("transformers", "the tiny model is built with transformers")
    from edgekit.converters.convert import convert_model
    from edgekit.targets.mlx import MlxTarget

    from tests.tiny_models import build_tiny_model

    src = build_tiny_model(family, root / "hf", **shape)
    out = root / "variant"
    convert_model(src, MlxTarget.format.name, out, quant="F32")
    return out


@pytest.fixture(scope="module")
def f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("mlx-batch"), "llama")


def _load(path: Path, **settings: Any) -> Any:
    from edgekit.targets.mlx import MlxTarget

    return MlxTarget.load(path, device="cpu", **settings)


@pytest.fixture(scope="module")
def session(f32: Path) -> Iterator[Any]:
    with _load(f32, context=CONTEXT) as s:
        yield s


def _batch(session: Any, *, slots: int = 4, keep: bool = True, **settings: Any) -> Any:
    """A batched runtime on the session's model; ``keep``: prefix reuse within the
    budget of ``slots`` full contexts (else none)."""
    from edgekit.targets.mlx import kv_cache_bytes
    from edgekit.targets.mlx_batch import open_batch

    folder = session._folder
    options = {
        "slots": slots,
        "context": CONTEXT,
        "eos_ids": folder.eos_ids,
        "vocab_size": folder.vocab_size,
        "kv_bytes": kv_cache_bytes(folder, CONTEXT, None) if keep else 0,
        **settings,
    }
    return open_batch(session._model, **options)


def _alone(session: Any, ids: list[int], sampling: Any) -> list[int]:
    """The single-stream session's tokens for ``ids`` (its own path: the seed, then
    generate_step with its options), end-of-sequence ids included."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    mx.random.seed(sampling.seed or 0)
    steps = generate_step(
        mx.array(ids),
        session._model,
        max_tokens=sampling.max_tokens,
        **session.step_options(sampling),
    )
    return [int(token) for token, _ in steps]


@dataclass
class Run:
    tokens: list[int] = field(default_factory=list)
    end: str | None = None
    cached: int | None = None  # what the first step told


def drive(
    runtime: Any,
    requests: dict[int, tuple[list[int], Any]],
    *,
    join: dict[int, int] | None = None,
    cancel: dict[int, int] | None = None,
) -> dict[int, Run]:
    """Run ``requests`` (rid -> prompt, sampling) to their max_tokens or end, as the batch
    loop does: those in ``join`` (rid -> step) are added at that step, those in
    ``cancel`` (rid -> tokens) removed once they have that many tokens."""
    from edgekit.targets.batching import SeqRequest

    join, cancel = join or {}, cancel or {}
    runs = {rid: Run() for rid in requests}
    live: set[int] = set()
    done: set[int] = set()
    step = 0
    while len(done) < len(requests):
        for rid, (prompt, sampling) in requests.items():
            if rid not in live and rid not in done and join.get(rid, 0) <= step:
                runtime.add(SeqRequest(rid=rid, prompt=tuple(prompt), sampling=sampling))
                live.add(rid)
        for out in runtime.step():
            run = runs[out.rid]
            if run.cached is None:
                run.cached = out.cached
            run.tokens += out.tokens
            run.end = out.end
            limit = cancel.get(out.rid, requests[out.rid][1].max_tokens)
            if out.end or len(run.tokens) >= limit:
                runtime.remove(out.rid)
                live.discard(out.rid)
                done.add(out.rid)
        step += 1
    return runs


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# --- settings ------------------------------------------------------------------------------


def test_parallel_is_a_load_setting_checked_as_the_other_targets_check_it(f32: Path) -> None:
    from edgekit.targets.mlx import MlxTarget

    assert "parallel" in MlxTarget.load_settings
    for bad in (0, 65, True, 2.0, "2"):
        with pytest.raises(SettingError, match="parallel") as err:
            _load(f32, parallel=bad)
        assert "1 to 64 (streams)" in f"{err.value.message} {err.value.hint}"
    with _load(f32, parallel=1) as one:
        assert one.parallel == 1 and one.batch_stats() is None
    with _load(f32, parallel=3, context=CONTEXT) as three:
        assert three.parallel == 3 and three.info.settings["parallel"] == 3
        assert three.info.context_length == CONTEXT  # each stream's
        assert three.generate(PROMPTS[0], max_tokens=4, temperature=0.0).completion_tokens == 4


def test_a_quantized_kv_cache_is_refused_with_parallel_streams(f32: Path, tmp_path: Path) -> None:
    from edgekit.targets.mlx_batch import open_batch

    with pytest.raises(SettingError, match="cannot run parallel streams") as err:
        _load(f32, parallel=2, kv_cache="q8_0")
    assert "kv_cache='f16'" in err.value.hint and "recorded" not in err.value.message
    recorded = Path(shutil.copytree(f32, tmp_path / "variant"))
    (recorded / "edgekit.json").write_text(json.dumps({"kv_cache": "q4_0"}))
    with pytest.raises(SettingError, match=r"q4_0 \(the variant's recorded default\)"):
        _load(recorded, parallel=2)
    with _load(recorded, parallel=2, kv_cache="f16") as s:
        assert s.parallel == 2 and s.info.settings["kv_bits"] is None
    with _load(f32) as s, pytest.raises(SettingError, match="8-bit KV cache"):
        open_batch(s._model, slots=2, context=64, eos_ids=(), vocab_size=512, kv_bits=8)
    with _load(f32) as s:
        for slots in (0, 65):
            with pytest.raises(SettingError, match="slots"):
                open_batch(s._model, slots=slots, context=64, eos_ids=(), vocab_size=512)


def test_the_memory_check_counts_every_stream(f32: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.targets.contract import MemoryCap
    from edgekit.targets.mlx import MlxTarget, check_memory, kv_cache_bytes
    from edgekit.targets.mlx_folder import read_folder

    folder = read_folder(f32)
    kv = kv_cache_bytes(folder, CONTEXT, None)
    cap = MemoryCap(bytes=folder.weight_bytes + 2 * kv, why="a test cap", hint="raise it")
    check_memory(folder, CONTEXT, None, cap, streams=2)
    with pytest.raises(InsufficientMemoryError, match=f"3 streams x {CONTEXT} tokens"):
        check_memory(folder, CONTEXT, None, cap, streams=3)
    monkeypatch.setattr(MlxTarget, "host_memory_cap", classmethod(lambda cls, kind: cap))
    with pytest.raises(InsufficientMemoryError, match="3 streams"):
        _load(f32, context=CONTEXT, parallel=3)
    _load(f32, context=CONTEXT, parallel=2).close()


# --- sampling ------------------------------------------------------------------------------


def test_every_request_samples_as_the_session_does(session: Any) -> None:
    hot = _sampling(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02, seed=7)
    penalised = _sampling(temperature=0.7, repeat_penalty=1.3, seed=11)
    other = _sampling(temperature=0.9, top_k=20, top_p=0.9, min_p=0.02, seed=8)
    greedy = _sampling()
    ids = [session.tokenize(p) for p in PROMPTS]
    requests = {0: (ids[0], greedy), 1: (ids[1], hot), 2: (ids[1], penalised), 3: (ids[1], other)}
    with closing(_batch(session, keep=False)) as rt:
        a = drive(rt, requests)
        b = drive(rt, requests, join={1: 3})  # one joins the running batch later
    assert [a[i].tokens for i in a] == [b[i].tokens for i in b]
    assert a[1].tokens != a[3].tokens  # another seed draws otherwise
    for rid, (prompt, sampling) in requests.items():
        assert a[rid].tokens == _alone(session, prompt, sampling), rid


def test_a_repeat_penalty_joining_after_requests_without_one_is_applied(session: Any) -> None:
    # mlx-lm 0.31 leaves its processor lists unfiltered when no request has one: the
    # runtime gives each request one, so a later penalty is not read from a departed slot
    prompt = session.tokenize(PROMPTS[0])
    penalised = _sampling(repeat_penalty=1.5)
    assert _alone(session, prompt, penalised) != _alone(session, prompt, _sampling())
    with closing(_batch(session, keep=False)) as rt:
        drive(rt, {0: (prompt, _sampling()), 1: (prompt, _sampling())})
        run = drive(rt, {2: (prompt, penalised)})[2]
    assert run.tokens == _alone(session, prompt, penalised)


# --- prefix reuse --------------------------------------------------------------------------


def test_a_kept_prefix_is_reused_and_changes_nothing(session: Any) -> None:
    from edgekit.targets.mlx_batch import MIN_REUSE

    ask = [
        session.tokenize(f"{SYSTEM} Question: {q}")
        for q in ("Why is the sky blue?", "What is rain?")
    ]
    shared = _common(ask[0], ask[1])
    assert shared >= MIN_REUSE
    greedy = _sampling()
    expected = [_alone(session, ids, greedy) for ids in ask]
    with closing(_batch(session, slots=2)) as rt:
        first = drive(rt, {0: (ask[0], greedy)})[0]
        second = drive(rt, {1: (ask[1], greedy)})[1]  # the first's prompt prefix
        again = drive(rt, {2: (ask[0], greedy)})[2]  # all of the first's prompt but its last
        cut = drive(rt, {3: (ask[1], greedy)}, cancel={3: 3})[3]  # removed while running
        after_cut = drive(rt, {4: (ask[1], greedy)})[4]
        rt.forget_prefixes()
        forgotten = drive(rt, {5: (ask[0], greedy)})[5]
        # only its first MIN_REUSE - 1 tokens in common with what is kept: too few
        near = ask[0][: MIN_REUSE - 1] + session.tokenize("zebra crossings", add_special=False)
        assert _common(near, ask[0]) == _common(near, ask[1]) == MIN_REUSE - 1
        short = drive(rt, {6: (near, greedy)})[6]
    assert (first.cached, second.cached, again.cached) == (0, shared, len(ask[0]) - 1)
    assert after_cut.cached == len(ask[1]) - 1 and cut.tokens == expected[1][:3]
    assert forgotten.cached == 0 and short.cached == 0
    for run, want in ((first, 0), (second, 1), (again, 0), (after_cut, 1), (forgotten, 0)):
        assert run.tokens == expected[want]


def test_the_kept_prefixes_stay_within_the_memory_budget(session: Any) -> None:
    prompt = session.tokenize(f"{SYSTEM} Question: Why is the sky blue?")
    greedy = _sampling()
    # a budget smaller than one sequence: nothing is kept
    with closing(_batch(session, slots=2, keep=False, kv_bytes=1)) as rt:
        runs = drive(rt, {0: (prompt, greedy)}) | drive(rt, {1: (prompt, greedy)})
    assert runs[1].cached == 0
    # at most ``slots`` entries: the third prompt pushes the first out
    others = [session.tokenize(f"{p} and so on") for p in PROMPTS[1:3]]
    with closing(_batch(session, slots=2)) as rt:
        drive(rt, {0: (prompt, greedy)})
        drive(rt, {1: (others[0], greedy)})
        drive(rt, {2: (others[1], greedy)})
        evicted = drive(rt, {3: (prompt, greedy)})[3]
        kept = drive(rt, {4: (others[1], greedy)})[4]
    assert evicted.cached == 0 and kept.cached == len(others[1]) - 1


# --- ends, refusals, failures --------------------------------------------------------------


def test_end_of_sequence_ignore_eos_and_a_full_context(session: Any) -> None:
    prompt = session.tokenize(PROMPTS[2])
    first = _alone(session, prompt, _sampling())[0]
    ending = _sampling(ignore_eos=False)
    # the model's first greedy token made an end id: the sequence ends at once, no token
    with closing(_batch(session, slots=2, eos_ids=(first,))) as rt:
        stop = drive(rt, {0: (prompt, ending)})[0]
        going = drive(rt, {1: (prompt, _sampling())})[1]
    assert (stop.end, stop.tokens) == ("stop", [])
    assert going.end is None and going.tokens[0] == first and len(going.tokens) == N
    with closing(_batch(session, slots=2, context=len(prompt) + 5)) as rt:
        full = drive(rt, {2: (prompt, _sampling(max_tokens=CONTEXT))})[2]
    assert full.end == "length" and len(full.tokens) == 5


def test_refusals_a_failed_step_and_closing(session: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgekit.targets.batching import SeqRequest

    prompt = tuple(session.tokenize(PROMPTS[0]))
    greedy = _sampling()
    rt = _batch(session, slots=1)
    with pytest.raises(GenerationError, match=f"a sequence holds {CONTEXT}") as err:
        rt.add(SeqRequest(rid=1, prompt=(1,) * CONTEXT, sampling=greedy))
    assert err.value.hint
    rt.add(SeqRequest(rid=1, prompt=prompt, sampling=greedy))
    with pytest.raises(GenerationError, match="running already"):
        rt.add(SeqRequest(rid=1, prompt=prompt, sampling=greedy))
    with pytest.raises(GenerationError, match="slots are taken"):
        rt.add(SeqRequest(rid=2, prompt=prompt, sampling=greedy))
    rt.remove(99)  # an id not running: nothing to do

    def broken() -> Any:
        raise RuntimeError("the device went away")

    monkeypatch.setattr(rt._gen, "next", broken)
    with pytest.raises(GenerationError, match="the device went away") as err:
        rt.step()
    assert err.value.hint
    assert rt.step() == []  # the failed request is not stepped again
    rt.remove(1)
    assert drive(rt, {2: (list(prompt), greedy)})[2].tokens == _alone(session, list(prompt), greedy)
    rt.close()
    rt.close()
    for call in (
        rt.step,
        rt.forget_prefixes,
        lambda: rt.add(SeqRequest(rid=3, prompt=prompt, sampling=greedy)),
    ):
        with pytest.raises(GenerationError, match="closed"):
            call()


def test_logits_while_streams_run(f32: Path, session: Any) -> None:
    ids = session.tokenize(PROMPTS[3])
    want = np.asarray(session.logits(ids))
    with _load(f32, parallel=2, context=CONTEXT) as s:
        streams = [
            s.stream(p, max_tokens=3 * N, temperature=0.0, ignore_eos=True) for p in PROMPTS[:2]
        ]
        readers = [threading.Thread(target=h.result) for h in streams]
        for reader in readers:
            reader.start()
        got = [np.asarray(s.logits(ids)) for _ in range(3)]
        for reader in readers:
            reader.join()
    for logits in got:
        np.testing.assert_array_equal(logits, want)


def test_gemma3_s_sliding_window_runs_batched_without_reuse(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # mlx-lm's gemma3_text has a global layer every sixth; a window of 8 positions (the
    # config's, shortened) makes the rotating caches wrap within these prompts
    variant = _build(tmp_path_factory.mktemp("mlx-gemma3"), "gemma3", layers=6)
    config = json.loads((variant / "config.json").read_text())
    (variant / "config.json").write_text(json.dumps({**config, "sliding_window": 8}))
    with _load(variant, context=CONTEXT) as s:
        ids = [s.tokenize(p) for p in PROMPTS]
        expected = [_alone(s, prompt, _sampling()) for prompt in ids]
        requests = {i: (prompt, _sampling()) for i, prompt in enumerate(ids)}
        with closing(_batch(s, slots=4)) as rt:
            runs = drive(rt, requests, join={3: 5})
            again = drive(rt, {9: (ids[3], _sampling())})[9]
    assert [runs[i].tokens for i in requests] == expected
    assert again.cached == 0 and again.tokens == expected[3]
