"""The SkipPipe planner: a pure library (protocol + stdlib + numpy; RNG passed in; no I/O).

    plan(topology, PlanConfig(strategy="skippipe", skip_ratio=1/3), seed) -> Schedule
    simulate(schedule, topology) -> SimResult          (one iteration on idle nodes)
    predict(schedule, topology, cost) -> Prediction    (steady state, with the iteration boundary)
    validate(schedule, topology) -> list[Violation]
"""
from coordinator.planner.config import STRATEGIES, PlanConfig, PlannerConfig, PlanningError
from coordinator.planner.entry import plan
from coordinator.planner.rules import path_length
from coordinator.planner.simulate import SimResult, TaskInterval, simulate
from coordinator.planner.steady import Prediction, predict
from coordinator.planner.validate import Violation, ViolationKind, validate

__all__ = ["STRATEGIES", "PlanConfig", "PlannerConfig", "PlanningError", "Prediction", "SimResult", "TaskInterval",
           "Violation", "ViolationKind", "path_length", "plan", "predict", "simulate", "validate"]
