"""`detrkit val` scores a saved checkpoint with validation's numbers and prints them per class."""

import re

from test_evaluate import last_validation

from detrkit.cli import main


def test_val_prints_the_validation_numbers(trained, shapes_dir, capsys, tmp_path):
    _, output = trained
    code = main(["val", "--checkpoint", str(output / "checkpoint_best_total.pth"), "--dataset", str(shapes_dir),
                 "--device", "cpu", "--no-plots", "--output", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0
    logged = last_validation(output)  # the only epoch: the best checkpoint holds the weights it scored
    found = re.search(r"mAP@50:95 (\S+)  mAP@50 (\S+)  mAR (\S+)", printed)
    assert found, printed
    expected = [f"{float(logged[f'val/{name}']):.4f}" for name in ("mAP_50_95", "mAP_50", "mAR")]
    assert list(found.groups()) == expected
    for name in ("circle", "square", "triangle", "TIDE dAP@50", "classification", "missed"):
        assert name in printed
    assert not (tmp_path / "plots").exists()
