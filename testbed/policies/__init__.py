"""Routing policies, in a registry by name.

A policy sees only :class:`CandidateView` rows (telemetry snapshots with their age, the router's
pending assignments, the router's own cache prediction) and returns a :class:`Choice`. ``decide``
must not change the policy's state: the ground truth re-runs it on the true state; ``commit``
records the decision actually taken.
"""

from ._base import (
    POLICIES,
    CandidateView,
    CandidateViewBuilder,
    Choice,
    Policy,
    RequestView,
    make_policy,
    register_policy,
)
from ._builtin import CacheAware, LeastLoad, PowerOfTwo, QPCost, RandomPolicy, RoundRobin

__all__ = [
    "POLICIES",
    "CacheAware",
    "CandidateView",
    "CandidateViewBuilder",
    "Choice",
    "LeastLoad",
    "Policy",
    "PowerOfTwo",
    "QPCost",
    "RandomPolicy",
    "RequestView",
    "RoundRobin",
    "make_policy",
    "register_policy",
]
