"""On CUDA under bf16 autocast, training steps of a tiny detector run with the sync debug mode
raising on every host sync, except in the matcher's solver (the switch points of test_sync_free)."""

import pytest
import torch
from test_sync_free import data, watched_fit  # noqa: F401 (data is a fixture)

pytestmark = pytest.mark.gpu


class SyncDebug:
    """A watch under which CUDA raises at any host sync while `on`."""

    def __init__(self) -> None:
        self._on, self.steps = False, 0

    @property
    def on(self) -> bool:
        return self._on

    @on.setter
    def on(self, value: bool) -> None:
        torch.cuda.set_sync_debug_mode("error" if value else "default")
        self._on = value


def test_bf16_training_steps_never_sync_on_cuda(data, tmp_path, tiny_kwargs):  # noqa: F811
    watch = SyncDebug()
    try:
        module = watched_fit(data, tmp_path, {**tiny_kwargs, "device": "cuda"}, watch, steps=4, device="cuda",
                             amp_dtype="bf16")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert watch.steps == 3 and module.trainer.precision == "bf16-mixed"
    assert next(module.model.parameters()).device.type == "cuda"
