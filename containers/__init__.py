"""The composition root: dependency-injector containers and nothing else."""

from containers.engine import EngineContainer
from containers.worker import WorkerContainer

__all__ = ["EngineContainer", "WorkerContainer"]
