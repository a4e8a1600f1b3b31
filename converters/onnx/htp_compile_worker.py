"""The child process of ``htp_compile``: compiles ONNX graphs to QNN HTP EPContext models.

Run as ``python -m edgekit.converters.onnx.htp_compile_worker`` with a JSON job on stdin
(written by ``htp_compile``, never by a user): the graphs of one part, in order, each with
the path its EPContext wrapper goes to, the QNN provider options and whether the graphs
share one QNN context (``ep.share_ep_contexts``; the last graph closes it with
``ep.stop_share_ep_contexts``, so the part's weights go into one ``.bin``). It prints one
JSON line with the seconds each graph took.

Why a separate process: the QNN HTP preparer holds several times the graph's weights while
it compiles and may abort the whole process on a graph it cannot take; the parent keeps
its memory and reports the failure with this process's stderr.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

EP_NAME = "QNNExecutionProvider"
JOB_BYTES = 1 << 20


def compile_graphs(job: dict[str, Any]) -> dict[str, float]:
    """Compile every graph of ``job`` (see the module text); returns seconds per graph."""
    import onnxruntime as ort
    import onnxruntime_qnn

    if EP_NAME not in {d.ep_name for d in ort.get_ep_devices()}:
        ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    graphs = job["graphs"]
    seconds: dict[str, float] = {}
    for i, graph in enumerate(graphs):
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: the parent keeps stderr's tail
        entries = {
            "ep.context_enable": "1",
            # 0: the binary is a .bin beside the wrapper (no 2 GB protobuf limit)
            "ep.context_embed_mode": "0",
            "ep.context_file_path": graph["ctx"],
            # every node on the HTP, or the compile fails: no CPU graph hides in a variant
            "session.disable_cpu_ep_fallback": "1",
        }
        if job["share"]:
            entries["ep.share_ep_contexts"] = "1"
            if i == len(graphs) - 1:
                entries["ep.stop_share_ep_contexts"] = "1"
        for key, value in entries.items():
            options.add_session_config_entry(key, value)
        options.add_provider_for_devices(devices, dict(job["options"]))
        start = time.perf_counter()
        session = ort.InferenceSession(graph["model"], sess_options=options)
        del session
        seconds[graph["name"]] = round(time.perf_counter() - start, 3)
    return seconds


def main() -> None:
    """Read the job, compile, write the reply; a failure is an uncaught exception, so the
    process exits non-zero with the traceback on stderr, which the parent reports."""
    job = json.loads(sys.stdin.buffer.read(JOB_BYTES))
    seconds = compile_graphs(job)
    sys.stdout.write(json.dumps({"seconds": seconds}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
