"""routeaudit testbed: an emulated fleet of data-parallel replicas behind reference routers,
run in virtual time, with workloads, faults and per-request ground truth.

    >>> import testbed
    >>> summary = testbed.run_scenario("stale_telemetry", n_requests=500, progress=False)
"""

from ._config import CostModel, FleetConfig, LabelConfig, ReplicaConfig, RouterConfig
from ._env import Environment
from ._errors import ConfigError, TestbedError, UnknownNameError, WorkloadError
from ._requests import Request
from ._scenarios import SCENARIOS, Scenario, prepare_scenario, run_scenario
from ._sim import RunSummary, Simulation
from .policies import POLICIES
from .workloads import WORKLOADS

__all__ = [
    "POLICIES",
    "SCENARIOS",
    "WORKLOADS",
    "ConfigError",
    "CostModel",
    "Environment",
    "FleetConfig",
    "LabelConfig",
    "ReplicaConfig",
    "Request",
    "RouterConfig",
    "RunSummary",
    "Scenario",
    "Simulation",
    "TestbedError",
    "UnknownNameError",
    "WorkloadError",
    "prepare_scenario",
    "run_scenario",
]
