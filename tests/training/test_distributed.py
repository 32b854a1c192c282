"""Multi-process training on CPU with gloo: Lightning's launcher and torchrun, files written once,
validation gathered without duplicates, and weights independent of the number of processes.

Every launch has a timeout: a hang is a failure.
"""

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from detrkit.datasets.synthetic import make_synthetic_dataset
from detrkit.training.evaluation import DetectionEvaluator

SCRIPT = Path(__file__).with_name("ddp_run.py")
TIMEOUT = 600


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_synthetic_dataset(tmp_path_factory.mktemp("data") / "shapes", num_train=6, num_valid=3,
                                  num_test=2, image_size=(96, 64), seed=0)


def launch(*args: str, torchrun: bool = False) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if torchrun \
        else [sys.executable]
    done = subprocess.run([*prefix, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def read_rank(output: Path, rank: int) -> dict:
    return json.loads((output / f"rank{rank}.json").read_text())


def last_weights(output: Path) -> dict[str, torch.Tensor]:
    return torch.load(output / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def two_processes(data, tmp_path_factory) -> Path:
    """2 processes x batch 1 through Lightning's own launcher (devices=2, strategy="ddp")."""
    output = tmp_path_factory.mktemp("ddp")
    launch("train", str(data), str(output), "--devices", "2", "--batch-size", "1")
    return output


def test_lightning_launcher_trains_and_only_the_main_process_writes(two_processes):
    main, other = read_rank(two_processes, 0), read_rank(two_processes, 1)
    assert other["ppid"] == main["pid"]  # Lightning started the second process
    assert not (two_processes / "writes1.txt").exists()
    writes = Counter((two_processes / "writes0.txt").read_text().split())
    regular = writes.pop("checkpoint_best_regular.pth")  # once per improvement
    assert 1 <= regular <= 2
    # training_config.json at start and end; per epoch last.ckpt and (interval 1) checkpoint_<epoch>
    assert writes == {"training_config.json": 2, "last.ckpt": 2, "checkpoint_0.ckpt": 1, "checkpoint_1.ckpt": 1,
                      "checkpoint_best_total.pth": 1}
    with open(two_processes / "metrics.csv") as stream:
        header = stream.readline()
    assert "test/mAP_50_95" in header  # run_test ran after fit, without hanging
    assert last_weights(two_processes)  # a complete checkpoint


def test_torchrun_runs_the_processes_it_started(data, tmp_path):
    # the documented recipe: devices="auto" in the script, the process layout from torchrun
    launch("train", str(data), str(tmp_path), "--devices", "auto", "--batch-size", "1", torchrun=True)
    main, other = read_rank(tmp_path, 0), read_rank(tmp_path, 1)
    assert main["ppid"] == other["ppid"]  # both children of torchrun's agent: no process spawned more
    assert not (tmp_path / "writes1.txt").exists()
    assert (tmp_path / "checkpoint_best_total.pth").is_file()
    for key, value in last_weights(tmp_path).items():
        assert torch.isfinite(value.float()).all(), key


def test_weights_do_not_depend_on_the_number_of_processes(data, two_processes, tmp_path):
    launch("train", str(data), str(tmp_path), "--devices", "1", "--batch-size", "2")
    one, two = last_weights(tmp_path), last_weights(two_processes)
    assert one.keys() == two.keys()
    moved = 0
    initial = torch.load(two_processes / "checkpoint_0.ckpt", weights_only=True)["state_dict"]
    for key in one:
        torch.testing.assert_close(one[key], two[key], rtol=0, atol=1e-5, msg=key)
        moved += not torch.equal(initial[key], one[key])
    assert moved > 100  # the second epoch changed the weights: the comparison means something


def test_validation_metrics_equal_a_single_process(data, two_processes, tmp_path):
    weights = str(two_processes / "checkpoint_best_total.pth")
    launch("validate", str(data), str(tmp_path / "one"), "--devices", "1", "--weights", weights)
    launch("validate", str(data), str(tmp_path / "two"), "--devices", "2", "--weights", weights)
    single = read_rank(tmp_path / "one", 0)["metrics"]
    assert single and "val/mAP_50_95" in single
    assert read_rank(tmp_path / "two", 0)["metrics"] == single
    assert read_rank(tmp_path / "two", 1)["metrics"] == single  # every process logs the same numbers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fake_epoch(count: int = 9) -> tuple[list[dict], list[dict]]:
    generator = torch.Generator().manual_seed(0)
    detections, truth = [], []
    for _ in range(count):
        boxes = torch.rand(3, 2, generator=generator) * 50
        boxes = torch.cat([boxes, boxes + 10 + torch.rand(3, 2, generator=generator) * 30], dim=1)
        labels = torch.randint(0, 2, (3,), generator=generator)
        truth.append({"boxes": boxes, "labels": labels})
        noisy = boxes + torch.randn(boxes.shape, generator=generator) * 3
        detections.append({"boxes": noisy, "scores": torch.rand(3, generator=generator), "labels": labels})
    return detections, truth


def _gather_worker(rank: int, world: int, port: int, result_path: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        detections, truth = fake_epoch()
        evaluator = DetectionEvaluator(100, backend="hotcoco")
        shard = range(rank, len(detections), world)  # what RFDETRDataModule gives each process
        evaluator.add([detections[i] for i in shard], [truth[i] for i in shard])
        evaluator.gather()
        scores = evaluator.compute()
        Path(f"{result_path}.{rank}").write_text(json.dumps(
            {"scores": scores, "count": len(evaluator),
             "first": evaluator._truth[1]["boxes"].tolist()}))
    finally:
        dist.destroy_process_group()


def test_gathered_validation_equals_one_process_exactly(tmp_path):
    detections, truth = fake_epoch()
    alone = DetectionEvaluator(100, backend="hotcoco")
    alone.add(detections, truth)
    expected = alone.compute()
    assert expected["mAP_50"] > 0
    mp.start_processes(_gather_worker, args=(2, free_port(), str(tmp_path / "result")), nprocs=2,
                       start_method="spawn", join=True)
    for rank in range(2):
        result = json.loads((tmp_path / f"result.{rank}").read_text())
        assert result["count"] == 9  # each image once: no duplicates, none missing
        assert result["first"] == truth[1]["boxes"].tolist()  # in the data set's order
        assert result["scores"] == expected
