"""The planner: which target, compute unit and format fit a device, predicted and
explained; and the one predictor of memory, decode, prefill, watts and J/token that plan,
pack, load's admission check and calibration share.

    plan        plan(), plan_for(): candidates, budgets, the pick; suggest_parallel()
    values      Budgets, Candidate, Plan
    candidates  one candidate, held to the budgets and the device's limits
    ranking     tiers, ranking, the plan's summary
    predict     Unit, Prediction, predict(), decode/prefill/J-per-token
    memory      the KV cache a target allocates, resident memory (per stream, too)
    admission   load_fit(): does a built variant fit this host now
    calibration bench results as samples per host; fitting: samples -> coefficients
    quality     expected loss per format, refined by local measurements
    sources     planning from an already-quantized source
"""

from __future__ import annotations

from edgekit.converters.planner.plan import (
    plan,
    plan_for,
    resolve_device,
    suggest_parallel,
    with_budget_defaults,
)
from edgekit.converters.planner.predict import Prediction, Unit
from edgekit.converters.planner.ranking import describe
from edgekit.converters.planner.values import (
    DEFAULT_CONTEXT,
    MAX_PARALLEL,
    MAX_SUGGESTED_PARALLEL,
    Budgets,
    Candidate,
    Plan,
)

__all__ = [
    "DEFAULT_CONTEXT",
    "MAX_PARALLEL",
    "MAX_SUGGESTED_PARALLEL",
    "Budgets",
    "Candidate",
    "Plan",
    "Prediction",
    "Unit",
    "describe",
    "plan",
    "plan_for",
    "resolve_device",
    "suggest_parallel",
    "with_budget_defaults",
]
