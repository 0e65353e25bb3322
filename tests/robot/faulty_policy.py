"""A served policy with faults keyed on the observation's prompt, for tests of ``robot.process``.

:func:`build_faulty` is what the server's child process builds in place of
``realtime.kinds.robot.build_tuned_policy`` (tests patch that name): it imports nothing from the
tests' harness, so the child stays light. The model is the real policy; only ``infer`` is wrapped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from models.policy.interface import Policy, PolicyFront
from realtime.config import RobotConfig
from realtime.kinds.robot import build_tuned_policy

POISON = "poison"  # infer raises ValueError (it pickles: it comes back as itself)
UNPICKLABLE = "unpicklable"  # infer raises an exception that does not pickle
SLOW = "slow"  # infer sleeps a second first (a forward in flight, to kill the child under)


class Unpicklable(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()  # locks do not pickle


class FaultyPolicy:
    def __init__(self, policy: Policy) -> None:
        self.policy, self.spec, self.device = policy, policy.spec, policy.device

    def front(self) -> PolicyFront:
        return self.policy.front()

    def prepare(self, observation: Any) -> Any:
        return self.policy.prepare(observation)

    def new_state(self) -> Any:
        return self.policy.new_state()

    def warmup(self, max_batch: int) -> None:
        self.policy.warmup(max_batch)

    def infer(self, batch: Sequence[Any], snapshots: Sequence[Any]) -> list[np.ndarray]:
        prompts = {item.observation.prompt for item in batch}
        if POISON in prompts:
            raise ValueError("the model's forward exploded")
        if UNPICKLABLE in prompts:
            raise Unpicklable("a forward error that cannot cross a pipe")
        if SLOW in prompts:
            time.sleep(1.0)
        return self.policy.infer(batch, snapshots)


def build_faulty(config: RobotConfig) -> FaultyPolicy:
    return FaultyPolicy(build_tuned_policy(config))
