"""The contract suite can fail: run on a target that breaks the contract, it fails exactly
the tests of the breaches, and passes the rest (so the failures are the breaches', not a
broken set-up).

The broken target is a plug-in like any other (tests/plugin_fakes.py): llama.cpp's
runtime, registered under its own name, with five breaches:

- its stream's last chunk carries text generate never gave;
- ``cancel`` does nothing;
- abandoning a stream blocks for a second (the generation "finishing its work"): twice
  the contract's bound (ABANDON_S, 0.5 s), so the breach is caught on any machine, and
  paid once per abandoned stream (six in the suite);
- its logits are 1% off;
- ``load`` drops a setting it does not know instead of refusing it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import require
from tests.plugin_fakes import install_plugin, run_contract_suite

NAME = "brokenfake"
BROKEN = '''
    """A target that breaks the session contract on purpose (tests/test_contract_can_fail.py)."""

    from __future__ import annotations

    import dataclasses
    import time

    from edgekit.targets.llamacpp import LlamaCppSession, LlamaCppTarget


    class Marked:
        """A generation handle whose streamed chunks end with a "!" its result lacks."""

        def __init__(self, handle):
            self._handle = handle

        def __iter__(self):
            return self

        def __next__(self):
            chunk = next(self._handle)
            extra = "!" if chunk.finish_reason else ""
            return dataclasses.replace(chunk, text=chunk.text + extra)

        def __getattr__(self, name):
            return getattr(self._handle, name)


    class BrokenSession(LlamaCppSession):
        def stream(self, prompt, sampling=None, **overrides):
            return Marked(super().stream(prompt, sampling, **overrides))

        def cancel(self):
            pass

        def stream_tokens(self, prompt_tokens, sampling):
            ended = False
            try:
                for chunk in super().stream_tokens(prompt_tokens, sampling):
                    ended = chunk.finish_reason is not None
                    yield chunk
            except GeneratorExit:
                if not ended:  # abandoned before its end: "finish the work" first
                    time.sleep(1)
                raise

        def logits(self, tokens):
            return super().logits(tokens) * 1.01


    class BrokenTarget(LlamaCppTarget):
        name = "brokenfake"
        display_name = "a broken fake (llama.cpp inside)"

        @classmethod
        def load(cls, model, **settings):
            known = {k: v for k, v in settings.items() if k in cls.load_settings}
            session = super().load(model, **known)
            session.__class__ = BrokenSession
            session.info = dataclasses.replace(session.info, target=cls.name)
            return session
'''
# The tests each breach fails (the contract suite's test names, without the target).
EXPECTED_FAILURES = {
    # the stream's extra text
    "test_stream_equals_generate",
    "test_stop_strings",
    "test_seeded_sampling_repeats",
    "test_a_stream_left_open_on_this_thread_is_refused_not_corrupted",
    "test_concurrent_calls_are_serialized_each_with_its_own_answer",
    "test_stream_text_equals_generate",  # the batched contract: the same breach, batched
    # Session.cancel ignored (a handle's own cancel does not go through it)
    "test_cancel_from_another_thread_stops_at_the_next_token",
    "test_session_cancel_stops_only_the_running_generation",
    # abandoning blocks
    "test_closing_a_stream_returns_at_once_and_frees_the_session",
    "test_dropping_a_stream_returns_at_once_and_frees_the_session",
    "test_close_ends_an_open_stream",
    "test_closing_a_handle_from_another_thread_returns_at_once",
    # logits off
    "test_logits_match_transformers",
    # unknown settings dropped
    "test_unknown_load_setting_lists_the_valid_ones",
}


@pytest.mark.slow
def test_the_contract_suite_fails_a_broken_target(tmp_path: Path) -> None:
    require("llama_cpp", "the broken fake runs llama.cpp")
    require("torch", "the contract suite builds its tiny model with transformers")
    plugin = install_plugin(
        tmp_path / "plugin",
        target=NAME,
        module="edgekit_brokenfake",
        cls="BrokenTarget",
        source=BROKEN,
    )
    run, outcomes = run_contract_suite(plugin, NAME, tmp_path / "junit.xml")
    assert outcomes, run.stdout[-5000:] + run.stderr[-5000:]
    assert all(NAME in name.partition("[")[2] for name in outcomes), outcomes  # the fake only
    failed = {name.partition("[")[0] for name, o in outcomes.items() if o in ("failed", "error")}
    unexpected, missed = sorted(failed - EXPECTED_FAILURES), sorted(EXPECTED_FAILURES - failed)
    assert not unexpected and not missed, f"failed unexpectedly: {unexpected}; passed: {missed}"
    others = {name: o for name, o in outcomes.items() if name.partition("[")[0] not in failed}
    assert set(others.values()) == {"passed"}, others
    assert run.returncode == 1
