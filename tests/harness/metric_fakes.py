"""Stand-ins for the optional metric packages (tensorboard, wandb: the ``[metrics]`` extra, not
installed in the test environment) that record what the metric writers call."""

from __future__ import annotations

import types


class FakeWandbRun:
    """What ``wandb.init`` returns: records its keyword arguments, logs and finish."""

    def __init__(self, **kwargs):
        self.init_kwargs, self.logged, self.finished = kwargs, [], False

    def log(self, metrics, step):
        self.logged.append((step, metrics))

    def finish(self):
        self.finished = True


def fake_metric_modules(tensorboard_calls: list, wandb_runs: list) -> dict:
    """``{module name: stand-in}`` to put in sys.modules: ``torch.utils.tensorboard``'s
    SummaryWriter appends ``("init", log_dir)``, ``(name, value, step)`` and ``("close",)``
    to ``tensorboard_calls``; ``wandb.init`` appends a FakeWandbRun to ``wandb_runs``."""

    class FakeSummaryWriter:
        def __init__(self, log_dir, max_queue=10):  # torch's default queue of 10 events
            tensorboard_calls.append(("init", log_dir))
            self.max_queue = max_queue

        def add_scalar(self, name, value, step):
            tensorboard_calls.append((name, value, step))

        def close(self):
            tensorboard_calls.append(("close",))

    summary = types.ModuleType("torch.utils.tensorboard")
    summary.SummaryWriter = FakeSummaryWriter
    wandb = types.ModuleType("wandb")
    wandb.init = lambda **kwargs: wandb_runs.append(FakeWandbRun(**kwargs)) or wandb_runs[-1]
    return {"tensorboard": types.ModuleType("tensorboard"), "torch.utils.tensorboard": summary,
            "wandb": wandb}
