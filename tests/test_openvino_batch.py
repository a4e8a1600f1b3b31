"""OpenVINO's batched runtime (targets/openvino_batch.py): the KV cache plan, the prefix
mirror, the pipeline's answers mapped (with a fake pipeline), and on the default model's
INT8 export: streams in a batch give what they give alone through the single-stream
session, requests join and leave a running batch without changing the others, a shared
prompt prefix is restored, end-of-sequence and a full context end a sequence, refusals.

Batched greedy tokens may differ from the session's where the model's choice is close: the
CPU plugin runs a matrix product of several rows through other kernels than one row, and
with its on-the-fly int8 quantization of activations (DYNAMIC_QUANTIZATION_GROUP_SIZE, on
by default for compressed weights) a stream's log-probabilities in a batch move by up to
about 0.2 against alone here (with that quantization off in both runs they agree within
3e-3). The evidence a difference must show is the runtime's own (``keep_log_probs``): up to
the first differing token the two runs' log-probabilities agree within LOG_PROB_TOL, and
there the two chosen tokens' log-probabilities agree within what those runs differed by on
the tokens they shared: each run's choice is within the other's noise of its own top.
(The IR's logits through ``Session.logits``, the batch contract's judge, are not such
evidence: they differ from the pipeline's own by about 0.1 at those positions.)
"""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from edgekit.errors import GenerationError, ModelFormatError, SettingError
from tests.conftest import require

CONTEXT = 1024
SLOTS = 4
TOKENS = 24
# Batched against alone, on the tokens both chose: the largest log-probability difference
# measured here was 0.20 (these four prompts, 64 tokens, the INT8 export at f32).
LOG_PROB_TOL = 0.3
LOG_PROB_FLOOR = 0.05  # a difference at the first token has no earlier ones to go by
PROMPTS = (
    "Once upon a time",
    "The capital of France is",
    "def fibonacci(n):",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
)
SMOLLM2 = {  # the default model's config.json: its KV cache shape
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "hidden_size": 576,
    "head_dim": 64,
}


def _greedy(**extra: Any) -> Any:
    from edgekit.targets.values import Sampling

    return Sampling(**{"max_tokens": 1 << 20, "temperature": 0.0, "ignore_eos": True, **extra})


# --- the KV cache plan and the prefix mirror (no model) --------------------------------------


def test_the_kv_cache_holds_every_slot_s_context() -> None:
    from edgekit.targets.openvino_batch import kv_plan

    plan = kv_plan(SMOLLM2, slots=4, context=1000, kind="CPU", kv="f16")
    # 30 layers x 3 KV heads x (K + V) x 64 values x 2 bytes; 32-token blocks on a CPU
    assert (plan.block, plan.blocks, plan.token_bytes) == (32, 4 * 32, 23_040)
    assert plan.bytes == 128 * 32 * 23_040
    assert kv_plan(SMOLLM2, slots=2, context=64, kind="GPU", kv="f32").blocks == 2 * 4
    quantized = kv_plan(SMOLLM2, slots=1, context=32, kind="CPU", kv="u8").token_bytes
    assert quantized == 30 * 3 * 2 * (64 + 8)  # values and a scale and zero point each
    no_shape = kv_plan({"hidden_size": 8}, slots=1, context=32, kind="CPU", kv="f16")
    assert no_shape.token_bytes is None and no_shape.bytes is None and no_shape.blocks == 1
    gqa = {**SMOLLM2, "head_dim": None}  # head_dim from hidden / heads
    assert kv_plan(gqa, slots=1, context=32, kind="CPU", kv="f16").token_bytes == 23_040


def test_the_prefix_mirror_claims_whole_blocks_it_knows_are_computed() -> None:
    from edgekit.targets.openvino_batch_prefix import PrefixMirror

    mirror = PrefixMirror(block=4, blocks=100)
    prompt = list(range(10))
    assert mirror.start(1, prompt) == 0
    assert mirror.start(2, prompt) == 0  # the first one's prompt is not computed yet
    mirror.computed(1, prompt)  # its first token came
    assert mirror.start(3, prompt) == 8  # two whole blocks; the rest is evaluated
    assert mirror.start(4, [*prompt[:6], 99, 98]) == 4  # shares one block only
    assert mirror.start(5, prompt[:8]) == 7  # all of it held: the last token is evaluated
    mirror.release(1, [*prompt, 10, 11, 12, 13])  # generated tokens join at the end
    assert mirror.start(6, [*prompt, 10, 11, 12, 13, 14, 15]) == 12


def test_the_prefix_mirror_forgets_what_may_be_overwritten() -> None:
    from edgekit.targets.openvino_batch_prefix import PrefixMirror

    mirror = PrefixMirror(block=4, blocks=6)
    shared, other = list(range(8)), list(range(100, 108))
    assert mirror.start(1, shared) == 0  # 2 blocks handed out
    mirror.computed(1, shared)
    mirror.release(1, shared)
    assert mirror.start(2, other) == 0  # 4
    mirror.computed(2, other)
    mirror.release(2, other)
    assert mirror.start(3, [*shared, 0]) == 8  # restored; its third block makes 5
    mirror.computed(3, [*shared, 0])
    mirror.grow(3, 13)  # 6: the whole pool handed out once, nothing overwritten yet
    # restored, but its last block is written, so copied: a seventh block, which may
    # overwrite any block no one holds (the other prompt's second one)
    assert mirror.start(4, other) == 7
    mirror.release(4)
    assert mirror.start(5, other) == 4
    mirror.release(5)
    mirror.grow(3, 17)  # an eighth block: no block no one holds is left
    assert mirror.start(6, other) == 0
    assert mirror.start(7, [*shared, 0, 1]) == 8  # request 3 still holds the shared blocks


# --- the pipeline's answers, with a fake pipeline ----------------------------------------


@dataclass
class _FakeHandle:
    outputs: list[tuple[list[int], str]] = field(default_factory=list)
    status: str = "RUNNING"
    cancelled: bool = False

    def can_read(self) -> bool:
        return bool(self.outputs)

    def read(self) -> dict[int, Any]:
        ids, reason = self.outputs.pop(0)
        out = SimpleNamespace(generated_ids=ids, finish_reason=SimpleNamespace(name=reason))
        return {0: out}

    def get_status(self) -> Any:
        return SimpleNamespace(name=self.status)

    def cancel(self) -> None:
        self.cancelled = True


class _FakePipe:
    def __init__(self) -> None:
        self.handles: dict[int, _FakeHandle] = {}
        self.configs: dict[int, Any] = {}

    def get_config(self) -> Any:
        return SimpleNamespace(eos_token_id=2, stop_token_ids={2, 7})

    def add_request(self, request_id: int, ids: Any, config: Any) -> _FakeHandle:
        self.configs[request_id] = config
        self.handles[request_id] = _FakeHandle()
        return self.handles[request_id]

    def has_non_finished_requests(self) -> bool:
        return True

    def step(self) -> None:
        pass


def test_finish_reasons_become_ends_and_the_end_of_sequence_id_no_token() -> None:
    require("openvino", "requests are handed to the pipeline as OpenVINO tensors")
    from edgekit.targets.batching import SeqRequest, SeqStep
    from edgekit.targets.openvino_batch import KvPlan, OpenVinoBatch

    pipe = _FakePipe()
    plan = KvPlan(slots=3, context=16, block=4, blocks=12, token_bytes=None)
    batch = OpenVinoBatch(pipe, plan)
    for rid, ignore in ((10, False), (11, True), (12, False)):
        batch.add(SeqRequest(rid=rid, prompt=(1, 3, 4), sampling=_greedy(ignore_eos=ignore)))
    config = pipe.configs[0]
    assert config.max_new_tokens == 13 and not config.do_sample and config.stop_strings == set()
    pipe.handles[0].outputs = [([5], "NONE"), ([2], "STOP")]
    pipe.handles[1].outputs = [([2], "NONE"), ([9], "LENGTH")]
    pipe.handles[2].status = "IGNORED"  # the scheduler dropped it
    assert batch.step() == [
        SeqStep(rid=10, tokens=(5,)),
        SeqStep(rid=11, tokens=(2,)),
        SeqStep(rid=12, tokens=(), end="length"),
    ]
    assert batch.step() == [
        SeqStep(rid=10, tokens=(), end="stop"),
        SeqStep(rid=11, tokens=(9,), end="length"),
    ]
    assert batch.step() == []  # ended sequences are not stepped again
    with pytest.raises(GenerationError, match="slots are taken"):
        batch.add(SeqRequest(rid=13, prompt=(1,), sampling=_greedy()))
    batch.remove(10)
    batch.add(SeqRequest(rid=13, prompt=(1,), sampling=_greedy()))
    batch.remove(13)
    assert pipe.handles[3].cancelled and not pipe.handles[0].cancelled
    batch.remove(99)  # not running: nothing to do
    batch.close()
    batch.close()
    with pytest.raises(GenerationError, match="closed"):
        batch.step()


def test_open_batch_refuses_before_loading(tmp_path: Path) -> None:
    from edgekit.targets.openvino_batch import open_batch
    from edgekit.targets.openvino_runtime import Settings

    def settings(device: str) -> Settings:
        return Settings(
            device=device,
            precision="f32",
            kv_cache="f16",
            context=64,
            threads=1,
            max_prompt_len=64,
            min_response_len=16,
        )

    with pytest.raises(SettingError, match="NPU"):
        open_batch(tmp_path, settings("NPU"), slots=2)
    with pytest.raises(SettingError, match="slots"):
        open_batch(tmp_path, settings("CPU"), slots=0)
    with pytest.raises(ModelFormatError, match="openvino_model.xml"):
        open_batch(tmp_path, settings("CPU"), slots=2)
    (tmp_path / "openvino_model.xml").write_text("<net/>")
    (tmp_path / "config.json").write_text(json.dumps({**SMOLLM2, "num_hidden_layers": 1000}))
    huge = replace(settings("CPU"), context=1 << 22)  # 256 x 4M tokens x 768 KB: not here
    with pytest.raises(GenerationError, match="GiB of memory is available"):
        open_batch(tmp_path, huge, slots=256)


# --- the default model (slow: its OpenVINO export) ------------------------------------------


@pytest.fixture(scope="module")
def folder(smollm2_openvino_int8: Path) -> Path:
    return smollm2_openvino_int8


@pytest.fixture(scope="module")
def session(folder: Path) -> Iterator[Any]:
    from edgekit.targets.openvino import OpenVinoTarget

    with OpenVinoTarget.load(folder, device="CPU", context=CONTEXT) as s:
        yield s


def _open(folder: Path, *, slots: int = SLOTS, context: int = CONTEXT, **extra: Any) -> Any:
    from edgekit.targets.openvino_batch import open_batch
    from edgekit.targets.openvino_runtime import read_settings

    settings = read_settings(
        "CPU",
        folder,
        inference_precision=None,
        kv_cache=None,
        threads=None,
        context=context,
        max_prompt_len=None,
        min_response_len=None,
    )
    return open_batch(folder, settings, slots=slots, **extra)


@pytest.fixture(scope="module")
def batch(folder: Path) -> Iterator[Any]:
    runtime = _open(folder, keep_log_probs=True)
    yield runtime
    runtime.close()


@dataclass
class _Run:
    ids: list[int] = field(default_factory=list)
    log_probs: tuple[float, ...] = ()
    end: str | None = None
    cached: int | None = None
    first_step: int | None = None  # the step that gave its first token


class _Loop:
    """What the batch loop does, in small: steps, collects, removes what ended or reached
    ``limit`` tokens."""

    def __init__(self, batch: Any, limit: int = TOKENS) -> None:
        self.batch, self.limit = batch, limit
        self.runs: dict[int, _Run] = {}
        self.steps = 0

    def add(self, rid: int, prompt: list[int], sampling: Any = None) -> None:
        from edgekit.targets.batching import SeqRequest

        request = SeqRequest(rid=rid, prompt=tuple(prompt), sampling=sampling or _greedy())
        self.batch.add(request)
        self.runs[rid] = _Run()

    def remove(self, rid: int) -> None:
        self.batch.remove(rid)
        self.runs[rid].end = self.runs[rid].end or "removed"

    def step(self) -> None:
        self.steps += 1
        for out in self.batch.step():
            run = self.runs[out.rid]
            if run.first_step is None and out.tokens:
                run.first_step, run.cached = self.steps, out.cached
            run.ids += out.tokens
            run.log_probs = self.batch.log_probs(out.rid)[: self.limit]
            if out.end is not None:
                run.end = out.end
                self.batch.remove(out.rid)
        for rid, run in self.runs.items():
            if run.end is None and len(run.ids) >= self.limit:
                del run.ids[self.limit :]
                self.remove(rid)

    def finish(self) -> dict[int, _Run]:
        while any(run.end is None for run in self.runs.values()):
            self.step()
        return self.runs


def _session_ids(session: Any, prompt: list[int], tokens: int = TOKENS) -> list[int]:
    """The session's greedy ids for ``prompt``: its own pipeline run as its stream_tokens
    runs it (the same configure() and inputs), without the streamer that makes them text."""
    import openvino_genai
    from edgekit.targets.openvino_runtime import configure, tokenized_inputs

    pipe = session._pipe
    config = configure(pipe.get_generation_config(), _greedy(), tokens)
    result = pipe.generate(tokenized_inputs(openvino_genai, prompt), config)
    return [int(t) for t in result.tokens[0]][:tokens]


def _alone(session: Any, batch: Any, prompts: list[list[int]]) -> list[_Run]:
    """Each prompt run alone through ``batch``: the session's ids exactly (one row, the
    session's kernels), with the log-probabilities the session does not report."""
    runs = []
    for prompt in prompts:
        loop = _Loop(batch)
        loop.add(0, prompt)
        runs.append(loop.finish()[0])
        assert runs[-1].ids == _session_ids(session, prompt)
    return runs


def _same_or_near_tie(alone: _Run, other: _Run) -> None:
    """``other`` (a batched stream) gives ``alone``'s ids where both have tokens, or first
    differs where the two runs' log-probabilities show a near tie (see the module text)."""
    shared = min(len(alone.ids), len(other.ids))
    k = next((i for i in range(shared) if alone.ids[i] != other.ids[i]), shared)
    noise = max(
        (abs(a - b) for a, b in zip(alone.log_probs[:k], other.log_probs[:k], strict=True)),
        default=0.0,
    )
    assert noise <= LOG_PROB_TOL, f"log-probabilities {noise:.3g} apart on the same tokens"
    if k == shared:
        return
    gap = abs(alone.log_probs[k] - other.log_probs[k])
    assert gap <= max(noise, LOG_PROB_FLOOR), (
        f"token {k} differs ({alone.ids[k]} alone, {other.ids[k]} batched) with "
        f"log-probabilities {gap:.3g} apart, where the runs differed by {noise:.3g} before: "
        "not a near tie"
    )


def test_streams_in_a_batch_give_what_they_give_alone(session: Any, batch: Any) -> None:
    prompts = [session.tokenize(p) for p in PROMPTS]
    alone = _alone(session, batch, prompts)
    streamed = session.stream_tokens(prompts[0], _greedy(max_tokens=TOKENS))
    assert "".join(c.text for c in streamed) == session.detokenize(alone[0].ids)
    loop = _Loop(batch)
    for rid, prompt in enumerate(prompts):
        loop.add(rid, prompt)
    runs = loop.finish()
    for rid in range(len(prompts)):
        assert len(runs[rid].ids) == TOKENS and runs[rid].end == "removed"
        _same_or_near_tie(alone[rid], runs[rid])


def test_requests_join_and_leave_a_running_batch(session: Any, batch: Any) -> None:
    prompts = [session.tokenize(p) for p in PROMPTS]
    alone = _alone(session, batch, prompts)
    loop = _Loop(batch)
    for rid in (0, 1, 2):
        loop.add(rid, prompts[rid])
    for _ in range(6):
        loop.step()
    loop.add(3, prompts[3])  # joins while the others decode
    for _ in range(4):
        loop.step()
    loop.remove(2)  # cancelled mid-run
    runs = loop.finish()
    assert 0 < len(runs[2].ids) < TOKENS
    assert [len(runs[rid].ids) for rid in (0, 1, 3)] == [TOKENS] * 3
    for rid in range(len(prompts)):
        _same_or_near_tie(alone[rid], runs[rid])


def test_a_shared_prefix_is_restored_not_evaluated(session: Any, folder: Path) -> None:
    text = importlib.resources.files("edgekit.data").joinpath("pride-and-prejudice-opening.txt")
    system = session.tokenize(text.read_text(encoding="utf-8"))[:700]
    # prompts go in 32 tokens a step, so the step of the first token tells how many the
    # pipeline restored (to within 32), beside what the mirror claims
    batch = _open(folder, slots=2, chunk_tokens=32, keep_log_probs=True)
    runs = []
    try:
        for prompt in (system, system, [*system[:650], *session.tokenize(" Mr. Darcy")]):
            loop = _Loop(batch, limit=8)
            loop.add(0, prompt)
            runs.append(loop.finish()[0])
    finally:
        batch.close()
    assert (runs[0].cached, runs[0].first_step) == (0, 22)  # 700 tokens, 32 a step
    # 21 whole blocks of 32 restored: the 28 tokens left take one step, as do 653 - 640
    assert (runs[1].cached, runs[1].first_step) == (672, 1)
    assert (runs[2].cached, runs[2].first_step) == (640, 1)
    # the restored blocks hold what the first run computed, and both evaluate the last 28
    # prompt tokens as one chunk over them: the same numbers, the same tokens
    assert runs[1].ids == runs[0].ids and runs[1].log_probs == runs[0].log_probs


def test_end_of_sequence_and_a_full_context_end_a_sequence(session: Any, batch: Any) -> None:
    chat = session.tokenize(session.render_chat([{"role": "user", "content": "What is 2+2?"}]))
    eos = session.tokenize("<|im_end|>", add_special=False)
    loop = _Loop(batch, limit=64)
    loop.add(0, chat, _greedy(ignore_eos=False))
    loop.add(1, chat)  # ignore_eos: past the end-of-sequence token, up to the limit
    loop.add(2, [*chat, *range(300, 300 + CONTEXT - 3 - len(chat))])  # room for 3 tokens
    runs = loop.finish()
    assert runs[0].end == "stop" and 0 < len(runs[0].ids) < 64
    assert eos[0] not in runs[0].ids and runs[1].ids[: len(runs[0].ids) + 1] == [*runs[0].ids, *eos]
    assert runs[1].end == "removed" and len(runs[1].ids) == 64
    assert (runs[2].end, len(runs[2].ids)) == ("length", 3)


def test_refusals_and_closing(session: Any, folder: Path) -> None:
    from edgekit.targets.batching import SeqRequest

    small = _open(folder, slots=1, context=64)
    assert (small.slots, small.context, small.plan.blocks) == (1, 64, 2)
    with pytest.raises(GenerationError, match="64"):
        small.add(SeqRequest(rid=1, prompt=tuple(range(1, 65)), sampling=_greedy()))
    small.add(SeqRequest(rid=1, prompt=(1, 2), sampling=_greedy()))
    with pytest.raises(GenerationError, match="running already"):
        small.add(SeqRequest(rid=1, prompt=(1, 2), sampling=_greedy()))
    small.step()
    assert small.cache_bytes() == small.plan.bytes  # as planned for an f16 cache
    assert small.tokenizer().decode([*session.tokenize("Hello there")]) == "Hello there"
    small.close()
    small.close()
    with pytest.raises(GenerationError, match="closed"):
        small.add(SeqRequest(rid=2, prompt=(1, 2), sampling=_greedy()))
