"""Names are data: a name, path or message read from a file is shown literally and safely.

A table of hostile names (rich and Textual markup, terminal escape sequences, OSC 8 links,
bidi overrides, NUL and other control characters, lone surrogates, very long names) is
placed where edgekit reads names: a model folder's name, a config's ``_name_or_path``, a
GGUF's ``general.name``, a bundle's and a variant's name in a manifest, a device profile's
names, saved bench results, the host probe, and the paths inside error messages. Every CLI
verb that shows the name runs through click's CliRunner, and the output must have:
the expected exit code, no traceback, no raw control character (no ESC reaches the
terminal), and the markup shown as the literal text it is. ``--json`` output stays exact.

Model output (``edgekit run`` / ``chat``) is content, not a name: its newlines and tabs
stay, escape sequences and other control characters are removed, markup is never read.
The TUI test runs the app on hostile names; the logging test checks the CLI's handler.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result
from edgekit.targets.values import StreamChunk

from edgekit.cli import main
from tests.builders import gguf_bytes, tiny_gguf_metadata, tiny_gguf_tensors
from tests.tui_fakes import recorded_probe, write_result

REPO = Path(__file__).parent.parent

# (id, hostile name, what the output must show of it)
NAMES: list[tuple[str, str, str]] = [
    ("close-tag", "[/bold]", "[/bold]"),
    ("close-any", "x[/]y", "x[/]y"),
    ("unbalanced-open", "[bold red]still bold", "[bold red]still bold"),
    ("rich-link", "[link=https://evil.example]click[/link]", "[link=https://evil.example]"),
    ("textual-action", "[@click=app.quit]quit[/]", "[@click=app.quit]quit[/]"),
    ("escaped-bracket", "a\\[b]c\\", "a\\[b]c\\"),
    ("emoji-code", "model :warning: :pile_of_poo:", ":warning: :pile_of_poo:"),
    ("csi-clear", "\x1b[2J\x1b[3J\x1b[Hgone", "gone"),
    ("csi-color", "\x1b[31mred\x1b[0m", "red"),
    ("osc-title", "\x1b]0;owned\x07title", "title"),
    ("osc8-link", "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\", "click"),
    ("c1-csi", "\x9b2Jc1-sequence", "c1-sequence"),
    ("bidi-override", "report\u202etxt.exe", "txt.exe"),
    ("bidi-isolate", "\u2067rtl\u2069 isolate", "isolate"),
    ("nul", "nul\x00byte", "byte"),
    ("bell-backspace", "ok\x07\x08\x08!!", "!!"),
    ("newline-forge", "name\nerror: forged line", "forged line"),
    ("carriage-return", "safe\rEVIL", "EVIL"),
    ("lone-surrogate", "bad\ud800name", "name"),
    ("very-long", "L" * 5000, "L" * 80),  # shown cut, and wrapped in a table title
    ("many-tags", "[b]" * 300, "[b][b][b][b]"),
]
NAME_IDS = [n[0] for n in NAMES]
# Names a file name can carry (no NUL, no '/', under NAME_MAX bytes); a lone surrogate is
# what Python makes of a file name that is not UTF-8.
FS_NAMES = [
    (i, n[:200], s[:150])
    for i, n, s in NAMES
    # a lone surrogate has no bytes: no file can be named so
    if "\x00" not in n and "/" not in n and "\ud800" not in n
] + [("undecodable-bytes", os.fsdecode(b"raw\xff\xfe\x1b[2Jbytes"), "bytes")]
# No NUL and no lone surrogate: what a command-line argument or a TOML string can hold.
ARG_NAMES = [n for n in NAMES if "\x00" not in n[1] and "\ud800" not in n[1]]
UTF8_NAMES = [n for n in NAMES if "\ud800" not in n[1]]  # what a GGUF string can hold

# What must never reach a terminal: C0 controls but newline and tab, DEL, C1 controls,
# the bidi embeddings, overrides and isolates, and lone surrogates.
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def check(result: Result, *, exit_code: int, shown: str | None) -> str:
    """The output of one command: the exit code, no traceback, nothing unsafe, and
    ``shown`` (the visible part of the hostile name) appears literally."""
    out = result.stdout + result.stderr
    detail = f"exit {result.exit_code}, exception {result.exception!r}, output:\n{out[-3000:]}"
    assert result.exit_code == exit_code, detail
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(detail) from result.exception
    assert "Traceback" not in out, detail
    bad = UNSAFE.search(out)
    assert bad is None, f"raw {bad.group()!r} at {bad.start()} in:\n{out!r}"[:3000]
    if shown is not None:
        assert shown in out, detail
    assert not any(line.startswith("error: forged") for line in out.splitlines()), detail
    return out


def invoke(args: Sequence[str], **kwargs: Any) -> Result:
    # a wide terminal: a name must not be cut by wrapping before it can be found
    env = {"COLUMNS": "3000", "NO_COLOR": None, "FORCE_COLOR": None, "TERM": "dumb"}
    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=True, **kwargs)


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGEKIT_CACHE", str(tmp_path / "cache"))


# --- where the names are put -------------------------------------------------------------


def gguf_named(folder: Path, name: str) -> Path:
    metadata = tiny_gguf_metadata()
    metadata["general.name"] = name
    path = folder / "model.gguf"
    path.write_bytes(gguf_bytes(metadata, tiny_gguf_tensors()))
    return path


def config_folder(folder: Path, name: str | None = None) -> Path:
    """A config-only Hugging Face folder (the Mistral-7B config) named ``name`` inside."""
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((REPO / "samples/configs/mistral-7b/config.json").read_text())
    if name is not None:
        config["_name_or_path"] = name
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def toml_string(s: str) -> str:
    return '"' + "".join(c if 0x20 <= ord(c) < 0x7F and c not in '"\\' else f"\\u{ord(c):04x}"
                         for c in s) + '"'  # fmt: skip


def profile_named(folder: Path, name: str) -> Path:
    """A copy of a shipped profile whose names, notes and labels are ``name``."""
    text = (REPO / "profiles/x86-laptop-no-gpu.toml").read_text()
    for key in ("name", "display_name", "model", "usable_note", "note"):
        value = f"{key} = {toml_string(name)}"
        text = re.sub(rf'(?m)^{key} = ".*"$', lambda _m, v=value: v, text)  # type: ignore[misc]
    path = folder / "hostile.toml"
    path.write_text(text)
    return path


def bundle_named(folder: Path, name: str, *, chat_template: str | None = "{{ x }}") -> Path:
    """A real bundle folder (one GGUF variant, true sizes and checksums) whose bundle,
    model and variant names are ``name``."""
    from edgekit.bundle_open import sha256_file
    from edgekit.manifest import (
        MANIFEST_NAME,
        SCHEMA_VERSION,
        FileEntry,
        Manifest,
        ModelIdentity,
        Provenance,
        RuntimeSettings,
        SourceModel,
        TokenizerInfo,
        Variant,
    )

    def variant(vname: str, folder_name: str) -> Variant:
        (folder / folder_name).mkdir(parents=True)
        model = gguf_named(folder / folder_name, "tiny")
        entry = f"{folder_name}/model.gguf"
        return Variant(
            name=vname,
            target="llamacpp",
            format="gguf",
            quant="F16",
            recipe={},
            entry=entry,
            files=(FileEntry(path=entry, size=model.stat().st_size, sha256=sha256_file(model)),),
            runtime=RuntimeSettings(context=512),
        )

    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        name=name,
        model=ModelIdentity(
            name=name,
            family="llama",
            architecture="LlamaForCausalLM",
            parameters=1000,
            context_length=2048,
            source=SourceModel(path=str(folder / "gone"), format="gguf", sha256="0" * 64),
        ),
        tokenizer=TokenizerInfo(kind="bpe-byte-level", chat_template=chat_template),
        variants=(variant(name, "v0"), variant(name + " (2)", "v1")),
        provenance=Provenance(
            edgekit_version="0.1.0", created="2026-01-01T00:00:00+00:00", backends={}, host="t"
        ),
    )
    (folder / MANIFEST_NAME).write_text(manifest.to_json())
    return folder


def results_named(folder: Path, name: str, file_name: str = "a") -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, fname in enumerate((f"{file_name}.json", "b.json")):
        path = write_result(folder, fname, variant="gguf-q4_k_m", decode=90.0 + i, rss=370.0)
        data = json.loads(path.read_text())
        data["variant"], data["quant"], data["target"] = name, name, name
        data["meter"]["name"] = name
        path.write_text(json.dumps(data))
        paths.append(path)
    return paths[0], paths[1]


# --- a session below the CLI: what the runtime would stream ------------------------------

# An answer with escape sequences split across chunks, markup, and real newlines and tabs.
HOSTILE_REPLY = [
    "line one\n\tindented [bold]not markup[/] ",
    "\x1b[2J\x1b",
    "[Hcleared \x1b]0;",
    "title\x07 \x1b]8;;https://evil.example\x1b\\link\x1b]8;;\x1b\\ ",
    "bidi \u202eevil\u202c ok \x9b31m c1 done\r\n",
]
HOSTILE_REPLY_SHOWN = "line one\n\tindented [bold]not markup[/] "


@dataclass
class _Variant:
    name: str


@dataclass
class _Info:
    target: str = "fake"


class FakeSession:
    """Streams ``HOSTILE_REPLY``; its bundle is a real opened bundle."""

    def __init__(self, bundle: Path, variant: str) -> None:
        from edgekit.bundle_open import open_bundle

        self.bundle = open_bundle(bundle)
        self.variant = _Variant(variant)
        self.info = _Info()

    def _reply(self) -> Iterator[StreamChunk]:
        for i, piece in enumerate(HOSTILE_REPLY):
            last = i == len(HOSTILE_REPLY) - 1
            yield StreamChunk(text=piece, tokens=1, finish_reason="stop" if last else None)

    def stream(self, prompt: str, sampling: Any = None) -> Iterator[StreamChunk]:
        return self._reply()

    def chat_stream(self, messages: Any, sampling: Any = None, **_: Any) -> Iterator[StreamChunk]:
        return self._reply()

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeSession:
        return self

    def __exit__(self, *_: object) -> None:
        pass


def fake_load(monkeypatch: pytest.MonkeyPatch, variant: str) -> None:
    import edgekit

    def load(bundle: Path, **_: Any) -> FakeSession:
        return FakeSession(Path(bundle), variant)

    monkeypatch.setattr(edgekit, "load", load)


# --- the CLI verbs ----------------------------------------------------------------------


@pytest.mark.parametrize(("case", "name", "shown"), UTF8_NAMES, ids=[n[0] for n in UTF8_NAMES])
def test_gguf_general_name(tmp_path: Path, case: str, name: str, shown: str) -> None:
    model = gguf_named(tmp_path, name)
    check(invoke(["inspect", str(model)]), exit_code=0, shown=shown)
    check(invoke(["inspect", str(model), "--tensors"]), exit_code=0, shown=shown)
    planned = invoke(["plan", str(model), "--device", "x86-laptop-no-gpu"])
    check(planned, exit_code=0, shown=shown)
    # --json stays exact: JSON escapes what it must, nothing is cleaned inside values
    exact = invoke(["inspect", str(model), "--json"])
    assert exact.exit_code == 0 and json.loads(exact.stdout)["name"] == name
    assert UNSAFE.search(exact.stdout) is None


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_config_name_or_path(tmp_path: Path, case: str, name: str, shown: str) -> None:
    folder = config_folder(tmp_path / "model", name)
    check(invoke(["inspect", str(folder)]), exit_code=0, shown=shown)
    check(invoke(["plan", str(folder), "-d", "galaxy-s25-ultra"]), exit_code=0, shown=shown)


@pytest.mark.parametrize(("case", "name", "shown"), FS_NAMES, ids=[n[0] for n in FS_NAMES])
def test_model_folder_name(tmp_path: Path, case: str, name: str, shown: str) -> None:
    folder = config_folder(tmp_path / name)
    check(invoke(["inspect", str(folder)]), exit_code=0, shown=shown)
    check(invoke(["plan", str(folder), "-d", "galaxy-s25-ultra"]), exit_code=0, shown=shown)
    # a folder that holds no model: the error message carries the path
    empty = tmp_path / "empty" / name
    empty.mkdir(parents=True)
    check(invoke(["inspect", str(empty)]), exit_code=1, shown=shown)
    check(invoke(["pack", str(empty), "-o", str(tmp_path / "out")]), exit_code=1, shown=shown)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("case", "name", "shown"), ARG_NAMES, ids=[n[0] for n in ARG_NAMES])
def test_paths_in_error_messages(tmp_path: Path, case: str, name: str, shown: str) -> None:
    missing = str(tmp_path / f"{name}.gguf")
    in_path = shown.replace("//", "/")[:40]  # as a path spells it
    for args in (
        ["inspect", missing],
        ["plan", missing],
        ["verify", missing],
        ["run", missing, "-p", "hi"],
        ["convert", missing, "--to", "gguf", "-o", str(tmp_path / "o.gguf")],
        ["bench", "--compare", missing, missing],
    ):
        check(invoke(args), exit_code=1, shown=in_path)
    # a name typed as an argument is quoted with repr() in these messages
    quoted = repr(shown)[1:-1][:40]
    check(invoke(["profiles", "show", name]), exit_code=1, shown=quoted)
    assert {p.name for p in tmp_path.iterdir()} <= {"cache"}  # nothing written
    # click's own errors (a path that must exist) carry the name too
    in_click = repr(in_path)[1:-1][:40]  # click quotes the path with repr()
    check(invoke(["tui", missing]), exit_code=2, shown=in_click)
    check(invoke(["eval", missing, "--reference", "x", "--text", missing]), exit_code=2,
          shown=in_click)  # fmt: skip


@pytest.mark.parametrize(("case", "name", "shown"), ARG_NAMES, ids=[n[0] for n in ARG_NAMES])
def test_profile_names(tmp_path: Path, case: str, name: str, shown: str) -> None:
    profile = profile_named(tmp_path, name)
    check(invoke(["profiles", "show", str(profile)]), exit_code=0, shown=shown)
    model = gguf_named(tmp_path, "tiny")
    check(invoke(["plan", str(model), "--device", str(profile)]), exit_code=0, shown=shown)
    exact = invoke(["profiles", "show", str(profile), "--json"])
    assert exact.exit_code == 0 and json.loads(exact.stdout)["display_name"] == name


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_bundle_and_variant_names(tmp_path: Path, case: str, name: str, shown: str) -> None:
    bundle = bundle_named(tmp_path / "b", name)
    check(invoke(["verify", str(bundle)]), exit_code=0, shown=shown)
    check(invoke(["verify", str(bundle), "--fast"]), exit_code=0, shown=shown)
    exact = invoke(["verify", str(bundle), "--json"])
    assert exact.exit_code == 0 and json.loads(exact.stdout)["variants"][0] == name
    # an unknown variant: the hint lists the bundle's (hostile) variant names
    for verb in (["run", str(bundle), "-p", "hi"], ["chat", str(bundle)], ["serve", str(bundle)]):
        check(invoke([*verb, "--variant", "nope"]), exit_code=1, shown=shown[:40])
    check(
        invoke(["eval", str(bundle), "--variant", "nope", "--reference", "x"]),
        exit_code=1,
        shown=shown[:40],
    )


@pytest.mark.parametrize(("case", "name", "shown"), FS_NAMES, ids=[n[0] for n in FS_NAMES])
def test_bundle_folder_name(tmp_path: Path, case: str, name: str, shown: str) -> None:
    bundle = bundle_named(tmp_path / name, "plain")
    check(invoke(["verify", str(bundle)]), exit_code=0, shown=shown)
    (bundle / "v0" / "model.gguf").write_bytes(b"tampered")
    check(invoke(["verify", str(bundle)]), exit_code=1, shown=shown)


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_run_and_chat_show_names_and_output_safely(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, name: str, shown: str
) -> None:
    bundle = bundle_named(tmp_path / "b", "plain")
    fake_load(monkeypatch, name)
    ran = invoke(["run", str(bundle), "-p", "hi"])
    check(ran, exit_code=0, shown=shown)
    # the model's text: markup literal, newlines and tabs kept, every escape sequence gone
    # whole (not only its ESC), even when split across chunks
    text = ran.stdout
    assert text.startswith(HOSTILE_REPLY_SHOWN) and "cleared" in text and "link" in text
    assert "[2J" not in text and "[H" not in text and "]0;" not in text and "8;;" not in text
    assert "evil" in text and "c1 done\n" in text
    chatted = invoke(["chat", str(bundle)], input="hello\n/exit\n")
    out = check(chatted, exit_code=0, shown=shown)
    assert HOSTILE_REPLY_SHOWN in out
    # --json is exact: the text as the model produced it, escaped by JSON
    exact = invoke(["run", str(bundle), "-p", "hi", "--json"])
    assert exact.exit_code == 0 and json.loads(exact.stdout)["text"] == "".join(HOSTILE_REPLY)
    assert json.loads(exact.stdout)["variant"] == name


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_bench_compare(tmp_path: Path, case: str, name: str, shown: str) -> None:
    a, b = results_named(tmp_path / "r", name)
    check(invoke(["bench", "--compare", str(a), str(b)]), exit_code=0, shown=shown)


@pytest.mark.parametrize(("case", "name", "shown"), FS_NAMES, ids=[n[0] for n in FS_NAMES])
def test_bench_compare_file_names(tmp_path: Path, case: str, name: str, shown: str) -> None:
    a, b = results_named(tmp_path / "r", "plain", file_name=name[:190])
    check(invoke(["bench", "--compare", str(a), str(b)]), exit_code=0, shown=shown[:100])


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_eval_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, name: str, shown: str
) -> None:
    from edgekit import evaluation
    from edgekit.accuracy import EvalResult

    result = EvalResult(
        perplexity=18.3,
        reference_perplexity=18.0,
        kl_mean=0.01,
        kl_p99=0.1,
        top1_agreement=0.95,
        tokens_scored=256,
        ctx=512,
        chunks=2,
    )
    monkeypatch.setattr(evaluation, "eval_bundle", lambda *a, **k: (name, result))
    bundle = bundle_named(tmp_path / "b", "plain")
    check(invoke(["eval", str(bundle), "--reference", "ref"]), exit_code=0, shown=shown)


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_probe(monkeypatch: pytest.MonkeyPatch, case: str, name: str, shown: str) -> None:
    from dataclasses import replace

    from edgekit.cli import probe_cmd
    from edgekit.host.sensors import SensorFacts
    from edgekit.probe import ProbePart

    report = recorded_probe()
    profile = replace(
        report.profile,
        display_name=name,
        cpu=replace(report.profile.cpu, model=name),
        accelerators=tuple(replace(a, name=name, note=name) for a in report.profile.accelerators),
    )
    report = replace(
        report,
        profile=profile,
        sensors=(SensorFacts(name="battery", readable=False, detail=name),),
        targets=tuple(replace(t, detail=name, version=name) for t in report.targets),
        parts=(ProbePart(name="jetson", ok=False, detail=f"OSError: {name}"),),
    )
    monkeypatch.setattr(probe_cmd, "probe_host", lambda **_: report)
    check(invoke(["probe"]), exit_code=0, shown=shown)


# --- model output: content, cleaned of escape sequences ---------------------------------

OUTPUTS = [
    ("sgr", "a\x1b[31mred\x1b[0m b", "ared b"),
    ("clear-home", "x\x1b[2J\x1b[Hy", "xy"),
    ("private-csi", "\x1b[?1049hscreen\x1b[?25l", "screen"),
    ("osc-title-bel", "x\x1b]0;title\x07y", "xy"),
    ("osc-title-st", "x\x1b]2;title\x1b\\y", "xy"),
    ("osc8", "x\x1b]8;;http://e.example\x1b\\link\x1b]8;;\x1b\\y", "xlinky"),
    ("osc52-clipboard", "\x1b]52;c;cm0gLXJmIH4=\x07ok", "ok"),
    ("dcs-sixel", "\x1bPq#0;2;0;0;0\x1b\\after", "after"),
    ("c1-csi", "\x9b2Jc", "c"),
    ("c1-osc", "\x9d0;t\x9cz", "z"),
    ("reset", "\x1bcreset", "reset"),
    ("charset", "\x1b(Bx", "x"),
    ("tab-newline", "tab\there\nnew", "tab\there\nnew"),
    ("crlf", "cr\r\nlf\rX", "cr\nlfX"),
    ("zwj-emoji", "family \U0001f468\u200d\U0001f469\u200d\U0001f467 ok", None),
    ("rtl-marks", "\u05e9\u05dc\u05d5\u05dd \u200f!", None),
    ("bidi-override", "bidi \u202eevil\u202c", "bidi evil"),
    ("nul-bell-backspace", "nul\x00 bell\x07 bs\x08", "nul bell bs"),
    ("lone-surrogate", "lone \ud800", "lone \ufffd"),
    ("markup", "[bold]x[/] [@click=app.quit]q[/]", None),
    ("unterminated-osc", "\x1b]0;never terminated", "]0;never terminated"),
    ("esc-at-end", "end\x1b", "end"),
    ("long-unterminated", "\x1b]" + "x" * 1500, "]" + "x" * 1500),  # longer than held back
]


@pytest.mark.parametrize(("case", "raw", "expected"), OUTPUTS, ids=[o[0] for o in OUTPUTS])
def test_output_cleaning(case: str, raw: str, expected: str | None) -> None:
    from edgekit.terminal_text import OutputCleaner, clean_output

    whole = clean_output(raw)
    assert whole == (raw if expected is None else expected)
    # however the stream splits the text (a sequence across tokens), the same result
    for cut in range(0, len(raw) + 1, 1 + len(raw) // 200):
        cleaner = OutputCleaner()
        assert cleaner.feed(raw[:cut]) + cleaner.feed(raw[cut:]) + cleaner.flush() == whole
    cleaner = OutputCleaner()
    assert "".join(cleaner.feed(c) for c in raw) + cleaner.flush() == whole


def test_output_cleaning_property() -> None:
    """Any text, split anywhere: nothing unsafe comes out, and the split does not matter."""
    from hypothesis import given
    from hypothesis import strategies as st

    from edgekit.terminal_text import OutputCleaner, clean_output

    pieces = st.sampled_from(["\x1b", "[", "]", "\\", "\x07", "\x9b", "\x9c", "\x9d", "P", ";",
                              "0", "m", "a", "\n", "\t", "\r", "\u202e", "\x00", "\ud800", "é"])  # fmt: skip
    texts = st.lists(pieces | st.text(max_size=4), max_size=40).map("".join)

    @given(texts, st.lists(st.integers(min_value=0, max_value=200), max_size=5))
    def run(raw: str, cuts: list[int]) -> None:
        whole = clean_output(raw)
        assert UNSAFE.search(whole) is None
        bounds = sorted({min(c, len(raw)) for c in cuts})
        cleaner = OutputCleaner()
        parts = [raw[a:b] for a, b in zip([0, *bounds], [*bounds, len(raw)], strict=True)]
        assert "".join(cleaner.feed(p) for p in parts) + cleaner.flush() == whole

    run()


# --- chat without a chat template -------------------------------------------------------


def test_chat_without_a_chat_template_points_at_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = bundle_named(tmp_path / "b", "plain", chat_template=None)
    fake_load(monkeypatch, "gguf-f16")
    result = invoke(["chat", str(bundle)], input="hello\n/exit\n")
    out = check(result, exit_code=1, shown="no chat template")
    assert "edgekit run" in out and "-p" in out and "generate()" not in out
    assert "you>" not in result.stdout  # refused before asking for a message


# --- the CLI's and the TUI's sources keep to the one way out ------------------------------


def test_sources_print_only_through_the_safe_renderers() -> None:
    """The CLI's consoles read no markup (a ``[bold]`` literal would be printed as it is),
    so no CLI module may write markup, build its own Console, or escape by hand; the TUI
    inserts names through ``edgekit.tui.shown``, not ``rich.markup.escape``."""
    markup = re.compile(r"""["'][^"'\n]*\[/?(?:bold|dim|red|yellow|green|b|i|u|link)\b""")
    cli = sorted((REPO / "edgekit/cli").glob("*.py"))
    tui = sorted((REPO / "tui").glob("*.py"))
    for path in cli:
        if path.name == "render.py":
            continue
        source = path.read_text()
        assert not markup.search(source), f"{path.name}: rich markup in a CLI string"
        assert "Console(" not in source.replace("SafeConsole(", ""), f"{path.name}: a Console"
        assert "rich.markup" not in source, f"{path.name}: escape by hand"
    for path in tui:
        source = path.read_text()
        assert "rich.markup" not in source, f"{path.name}: rich's escape is not Textual's"
        assert ".notify(" not in source or "markup=False" in source, path.name


# --- progress bars and logging ----------------------------------------------------------


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_progress_bars(monkeypatch: pytest.MonkeyPatch, case: str, name: str, shown: str) -> None:
    from edgekit.cli import err_console, progress
    from edgekit.progress import ProgressEvent

    sink = io.StringIO()
    # the CLI's own console class, as on a terminal
    console = type(err_console)(file=sink, force_terminal=True, width=3000, color_system=None)
    monkeypatch.setattr(progress, "err_console", console)
    with progress.progress_bars() as on_progress:
        on_progress(ProgressEvent(stage=name, done=0, total=2, detail=name))
        on_progress(ProgressEvent(stage=name, done=1, total=2, detail=name))
    shown_text = sink.getvalue()
    # a terminal gets rich's own cursor movements, and nothing from the name
    for needle in ("\x1b]", "\x07", "\x1b[2J", "\x1b[H", "\x9b", "\u202e", "\x00", "\r\n"):
        if needle in name:
            assert needle not in shown_text
    without_cursor_moves = re.sub(r"\x1b\[\??[0-9;]*[A-Za-z]", "", shown_text).replace("\r", "")
    assert UNSAFE.search(without_cursor_moves) is None


@pytest.mark.parametrize(("case", "name", "shown"), NAMES, ids=NAME_IDS)
def test_log_records_are_cleaned(
    monkeypatch: pytest.MonkeyPatch, case: str, name: str, shown: str
) -> None:
    """``edgekit -v`` logs through a handler that cleans every record's message, its
    arguments and its traceback text; the record's own level and template stay."""
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.root, "level", logging.WARNING)
    # An earlier test may have run uvicorn, whose logging config gives its loggers handlers
    # of their own (edgekit serve adds the same cleaning filter to those): start from none.
    for logger_name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(logger_name)
        monkeypatch.setattr(logger, "handlers", [])
        monkeypatch.setattr(logger, "propagate", True)

    @click.command("log-something")
    def log_something() -> None:
        log = logging.getLogger("edgekit.somewhere")
        log.warning("loaded %s from %r", name, Path(name))
        log.warning(f"an f-string with {name}")
        try:
            raise ValueError(name)
        except ValueError:
            log.error("failed: %s", name, exc_info=True)
        logging.getLogger("uvicorn.error").warning("client sent %s", name)

    main.add_command(log_something)
    try:
        result = invoke(["-v", "log-something"])
    finally:
        main.commands.pop("log-something")
        handlers = list(logging.root.handlers)
        for h in handlers:
            logging.root.removeHandler(h)
    out = result.stderr
    assert result.exit_code == 0, out
    bad = UNSAFE.search(out)
    assert bad is None, f"raw {bad.group()!r} at {bad.start()} in:\n{out!r}"[:3000]
    lines = out.splitlines()
    # one line a record (its traceback indented below it), none forged by a name
    assert [ln.split(":")[0] for ln in lines if not ln.startswith((" ", "Traceback"))] == [
        "WARNING edgekit.somewhere",
        "WARNING edgekit.somewhere",
        "ERROR edgekit.somewhere",
        "WARNING uvicorn.error",
    ], out
    assert "  Traceback (most recent call last):" in lines and "ValueError" in out
    assert all(shown in ln for ln in lines if ln.startswith(("WARNING", "ERROR"))), out


# --- the TUI ----------------------------------------------------------------------------

# Each run of the app takes seconds: three names by default, the rest marked slow.
_TUI_FAST = ("close-tag", "textual-action", "osc8-link")
_TUI_SLOW = ("unbalanced-open", "csi-clear", "bidi-override", "newline-forge", "lone-surrogate",
             "very-long")  # fmt: skip
TUI_NAMES = [
    pytest.param(*n, id=n[0], marks=() if n[0] in _TUI_FAST else pytest.mark.slow)
    for n in NAMES
    if n[0] in _TUI_FAST + _TUI_SLOW
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _shown(value: object) -> str:
    return str(value)


@pytest.mark.anyio
@pytest.mark.parametrize(("case", "name", "shown"), TUI_NAMES)
async def test_tui_shows_hostile_names_literally(
    tmp_path: Path, case: str, name: str, shown: str
) -> None:
    from tests.conftest import require

    require("textual", "the TUI is a Textual app")
    import time
    from dataclasses import replace

    from edgekit.tui.app import EdgekitApp
    from edgekit.tui.bench import BenchPane
    from edgekit.tui.chat import ChatPane
    from edgekit.tui.sources import Sources
    from textual.widgets import DataTable, Select, Static

    from edgekit.host.sensors import SensorFacts

    report = recorded_probe()
    report = replace(
        report,
        profile=replace(
            report.profile,
            display_name=name,
            cpu=replace(report.profile.cpu, model=name),
            accelerators=tuple(replace(a, name=name) for a in report.profile.accelerators),
        ),
        sensors=(SensorFacts(name="battery", readable=False, detail=name),),
        targets=tuple(replace(t, detail=name) for t in report.targets),
    )  # fmt: skip
    results = tmp_path / "results"
    results_named(results, name)
    bundle = bundle_named(tmp_path / "bundle", name)
    arg_name = name.replace("\x00", "").replace("\ud800", "")
    profile = profile_named(tmp_path, arg_name)
    model = config_folder(tmp_path / "model", name)
    app = EdgekitApp(
        Sources(
            model=model, bundle=bundle, device=str(profile), results=results, probe=lambda: report
        )
    )

    def static(selector: str) -> str:
        return _shown(app.query_one(selector, Static).content)

    def cells(selector: str) -> str:
        table = app.query_one(selector, DataTable)
        rows = [table.get_row_at(i) for i in range(table.row_count)]
        labels = [c.label for c in table.columns.values()]
        return " ".join(_shown(c) for c in [*labels, *(cell for row in rows for cell in row)])

    async def until(pilot: Any, ok: Callable[[], bool]) -> None:
        end = time.monotonic() + 30
        while not ok():
            assert time.monotonic() < end, "timed out waiting for the TUI"
            await pilot.pause(0.1)

    visible = shown[:100]
    async with app.run_test(size=(200, 50)) as pilot:
        await until(pilot, lambda: visible in static("#host-summary"))
        await until(pilot, lambda: visible in cells("#sensors"))
        assert visible in cells("#units")
        await pilot.press("p")
        await until(pilot, lambda: "pick" in static("#plan-summary"))
        summary = static("#plan-summary")
        assert visible in summary  # the model's name and the profile's display name
        await pilot.press("b")
        assert visible in static("#bench-bundle")
        select = app.query_one("#bench-variant", Select)
        assert any(visible in _shown(prompt) for prompt, _ in select._options)
        assert isinstance(app.query_one(BenchPane), BenchPane)
        await pilot.press("c")
        assert visible in cells("#compare-files") and visible in cells("#compare-table")
        # a failing bundle with a hostile path becomes a notification, shown literally
        app.bundle_changed(tmp_path / "missing" / arg_name.replace("/", "_")[:200])
        await until(pilot, lambda: any(n.severity == "error" for n in app._notifications))
        # the chat streams hostile model output: markup literal, escapes removed
        chat = app.query_one(ChatPane)
        chat.session = FakeSession(bundle, name)
        app.sources.bundle = bundle
        await pilot.press("h", *"hi", "enter")
        await until(pilot, lambda: not chat._generating and len(chat.messages) == 2)
        log_text = " ".join(_shown(line.text) for line in app.query_one("#chat-log").lines)  # type: ignore[attr-defined]
        assert "[bold]not markup[/]" in log_text
        # every text the app shows holds no control character from a name
        for widget in app.query(Static):
            text = _shown(widget.content)
            assert UNSAFE.search(text) is None, (widget.id, text)
        for note in app._notifications:
            assert UNSAFE.search(note.message) is None and UNSAFE.search(note.title) is None
        assert app.is_running
    assert app.return_code in (0, None)
    shutil.rmtree(tmp_path / "bundle")


def test_uvicorn_log_handlers_clean_records(capsys: pytest.CaptureFixture[str]) -> None:
    """``edgekit serve`` configures uvicorn's own handlers with the cleaning filter: a path
    or header a client sent cannot reach the terminal raw through uvicorn's logs."""
    import logging.config

    from edgekit.serve import _uvicorn_log_config

    loggers = [logging.getLogger(n) for n in ("uvicorn", "uvicorn.error", "uvicorn.access")]
    saved = [(lg.handlers[:], lg.propagate, lg.level) for lg in loggers]
    try:
        logging.config.dictConfig(_uvicorn_log_config())
        logging.getLogger("uvicorn.error").warning("client sent %s", "\x1b]0;owned\x07\x1b[2J")
        logging.getLogger("uvicorn.access").info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET", "/\x1b[31mred", "1.1", 404
        )
    finally:
        for lg, (handlers, propagate, level) in zip(loggers, saved, strict=True):
            lg.handlers, lg.propagate, lg.level = handlers, propagate, level
    err = capsys.readouterr()
    shown = err.err + err.out
    assert "client sent" in shown and "404" in shown
    assert "\x1b" not in shown and "\x07" not in shown
