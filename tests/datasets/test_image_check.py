"""The up-front image check: each bad case, its one error or skip warning, and the cache beside the annotations."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
from PIL import Image
from tiny_data import annotation, coco_file, write_image

from detrkit.config import ModelConfig, TrainConfig
from detrkit.datasets import image_cache
from detrkit.datasets.detect import build_datasets
from detrkit.datasets.detection import SampleLoadError
from detrkit.datasets.image_cache import CACHE_NAME
from detrkit.datasets.image_check import BadImagesError, ImageScreen, check_images


@pytest.fixture(autouse=True)
def _user_cache(tmp_path, monkeypatch) -> Path:
    """The fallback cache goes to the test's own folder, never the user's."""
    folder = tmp_path / "user-cache"
    monkeypatch.setenv("DETRKIT_CACHE", str(folder))
    return folder


@pytest.fixture
def opened(monkeypatch) -> list[Path]:
    """Every path PIL's Image.open is called on."""
    calls, real = [], Image.open

    def counting(path, *args, **kwargs):
        calls.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Image, "open", counting)
    return calls


def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def listed(*paths: Path, size: tuple[int, int] | None = (30, 40)) -> list:
    return [(path, size) for path in paths]


def test_good_images_of_each_checked_format_pass(tmp_path):
    files = [write_image(tmp_path / f"a.{suffix}", 40, 30) for suffix in ("jpg", "png", "webp", "bmp")]
    assert check_images(listed(*files), tmp_path, "split") == {}


def test_each_bad_case_is_named_with_what_is_wrong(tmp_path):
    cut_jpeg = truncate(write_image(tmp_path / "cut.jpg", 40, 30))
    cut_png = truncate(write_image(tmp_path / "cut.png", 40, 30))
    cut_webp = truncate(write_image(tmp_path / "cut.webp", 40, 30))
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"this is not an image at all" * 10)
    wrong_size = write_image(tmp_path / "wide.jpg", 50, 20)
    missing = tmp_path / "missing.jpg"
    bad = check_images(listed(cut_jpeg, cut_png, cut_webp, garbage, wrong_size, missing), tmp_path, "split")
    assert set(bad) == {cut_jpeg, cut_png, cut_webp, garbage, wrong_size, missing}
    for cut in (cut_jpeg, cut_png):  # readable headers, cut data: the full decode fails
        assert bad[cut].startswith("truncated or corrupt")
    for unreadable in (cut_webp, garbage):  # PIL opens WebP by decoding it
        assert bad[unreadable].startswith("cannot be opened as an image")
    assert bad[wrong_size] == "is 50x20 (WxH) but its annotations say 40x30"
    assert bad[missing] == "does not exist"


def test_data_after_the_jpeg_end_is_decoded_in_full_and_passes(tmp_path, opened):
    """A motion photo appends a video after the JPEG's EOI: the tail test fails, the full decode passes."""
    photo = write_image(tmp_path / "motion.jpg", 40, 30)
    photo.write_bytes(photo.read_bytes() + b"\x00ftypmp42 appended video" * 20)
    assert check_images(listed(photo), tmp_path, "split") == {}
    assert len(opened) == 2  # the header, then the full decode


def test_the_size_check_is_skipped_where_annotations_give_none(tmp_path):
    image = write_image(tmp_path / "a.png", 50, 20)
    assert check_images(listed(image, size=None), tmp_path, "split") == {}


def test_a_second_check_opens_no_image_and_a_changed_file_is_checked_again(tmp_path, opened):
    good = [write_image(tmp_path / f"{i}.jpg", 40, 30, seed=i) for i in range(3)]
    cut = truncate(write_image(tmp_path / "cut.jpg", 40, 30))
    first = check_images(listed(*good, cut), tmp_path, "split")
    assert set(first) == {cut} and len(opened) == 5  # 4 headers, 1 full decode of the cut file
    assert (tmp_path / CACHE_NAME).is_file()
    opened.clear()
    assert check_images(listed(*good, cut), tmp_path, "split") == first  # the bad verdict is cached too
    assert opened == []
    write_image(good[0], 40, 30, seed=7)  # new content: another byte size or mtime
    stat = os.stat(good[1])
    os.utime(good[1], ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))  # touched only
    assert check_images(listed(*good, cut), tmp_path, "split") == first
    assert sorted(opened) == sorted(good[:2])


def test_an_image_resized_in_place_is_found_after_a_cached_run(tmp_path):
    image = write_image(tmp_path / "a.png", 40, 30)
    assert check_images(listed(image), tmp_path, "split") == {}
    write_image(image, 41, 30)
    assert check_images(listed(image), tmp_path, "split") == {image: "is 41x30 (WxH) but its annotations say 40x30"}


def test_sections_of_one_cache_file_are_kept_apart(tmp_path, opened):
    train, valid = write_image(tmp_path / "t.png", 40, 30), write_image(tmp_path / "v.png", 40, 30)
    check_images(listed(train), tmp_path, "train.json")
    check_images(listed(valid), tmp_path, "valid.json")
    sections = json.loads((tmp_path / CACHE_NAME).read_text())["sections"]
    assert set(sections) == {"train.json", "valid.json"}
    assert list(sections["train.json"]) == ["t.png"]
    opened.clear()
    check_images(listed(train), tmp_path, "train.json")
    check_images(listed(valid), tmp_path, "valid.json")
    assert opened == []


def test_a_corrupt_cache_file_is_ignored(tmp_path):
    image = write_image(tmp_path / "a.png", 40, 30)
    (tmp_path / CACHE_NAME).write_text("{not json")
    assert check_images(listed(image), tmp_path, "split") == {}
    assert json.loads((tmp_path / CACHE_NAME).read_text())["version"] == image_cache.CACHE_VERSION


def refuse_folders(monkeypatch, *folders: Path) -> None:
    """Writing a temporary file in any of `folders` fails as in a read-only folder (tests run as root,
    where chmod does not stop writes)."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir) in folders:
            raise PermissionError(13, "Permission denied", str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(image_cache.tempfile, "mkstemp", mkstemp)


def test_an_unwritable_annotation_folder_caches_in_the_user_cache(tmp_path, monkeypatch, opened, _user_cache):
    folder = tmp_path / "read-only"
    image = write_image(folder / "a.png", 40, 30)
    refuse_folders(monkeypatch, folder)
    assert check_images(listed(image), folder, "split") == {}
    assert not (folder / CACHE_NAME).exists()
    assert len(list((_user_cache / "image-check").glob("*.json"))) == 1
    opened.clear()
    assert check_images(listed(image), folder, "split") == {}
    assert opened == []


def test_no_writable_cache_anywhere_still_checks(tmp_path, monkeypatch, _user_cache):
    folder = tmp_path / "read-only"
    cut = truncate(write_image(folder / "a.jpg", 40, 30))
    refuse_folders(monkeypatch, folder, _user_cache / "image-check")
    for _ in range(2):
        assert set(check_images(listed(cut), folder, "split")) == {cut}
    assert not (folder / CACHE_NAME).exists() and not list((_user_cache / "image-check").glob("*.json"))


def test_the_error_names_up_to_twenty_files_then_counts(tmp_path):
    screen = ImageScreen()
    assert len(screen(tmp_path, "split", listed(*(tmp_path / f"{i:02d}.jpg" for i in range(25))))) == 25
    with pytest.raises(BadImagesError) as caught:
        screen.finish()
    text = str(caught.value)
    assert text.startswith("25 bad image file(s)") and "skip_bad_images=True" in text
    assert all(f"{tmp_path / f'{i:02d}.jpg'}: does not exist" in text for i in range(20))
    assert "20.jpg" not in text and text.endswith("and 5 more")


def roboflow(root: Path) -> Path:
    """train: three 40x30 JPEGs with a box each; valid: two."""
    for split, count in (("train", 3), ("valid", 2)):
        images = [{"id": i, "file_name": f"{i}.jpg", "width": 40, "height": 30} for i in range(count)]
        coco_file(root / split, [annotation(i, [2, 2, 10, 10], image_id=i) for i in range(count)], images=images)
    return root


def build(root: Path, **train):
    return build_datasets(TrainConfig(dataset_dir=str(root), progress_bar=None, **train),
                          ModelConfig(pretrain_weights=None, device="cpu"))


def test_build_datasets_names_bad_files_of_every_split_in_one_error(tmp_path):
    root = roboflow(tmp_path / "data")
    truncate(root / "train" / "1.jpg")
    (root / "valid" / "0.jpg").unlink()
    with pytest.raises(BadImagesError) as caught:
        build(root)
    text = str(caught.value)
    assert text.startswith("2 bad image file(s)")
    assert f"{root / 'train' / '1.jpg'}: truncated or corrupt" in text
    assert f"{root / 'valid' / '0.jpg'}: does not exist" in text


def test_skip_bad_images_leaves_them_and_their_boxes_out_with_one_warning(tmp_path):
    root = roboflow(tmp_path / "data")
    truncate(root / "train" / "1.jpg")
    write_image(root / "valid" / "1.jpg", 41, 30)
    with pytest.warns(UserWarning, match=r"leaving out 2 bad image file\(s\) \(train/_annotations.coco.json 1, "
                                         r"valid/_annotations.coco.json 1\)") as caught:
        splits = build(root, skip_bad_images=True)
    assert len([w for w in caught if "bad image" in str(w.message)]) == 1
    assert [r.path.name for r in splits.train.records] == ["0.jpg", "2.jpg"]
    assert [r.path.name for r in splits.valid.records] == ["0.jpg"]
    assert [len(r.labels) for r in splits.train.records] == [1, 1]
    assert len(splits.train) == 2 and splits.train[1][1].image_id == 2  # the loader reads only good files


def test_skip_bad_images_still_fails_when_a_split_has_no_good_image(tmp_path):
    root = roboflow(tmp_path / "data")
    for i in range(2):
        truncate(root / "valid" / f"{i}.jpg")
    with pytest.raises(BadImagesError, match="every image of valid/_annotations.coco.json is bad"):
        build(root, skip_bad_images=True)


def test_coco2017_splits_share_one_cache_in_the_annotations_folder(tmp_path, opened):
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    for split in ("train2017", "val2017"):
        images = [{"id": 1, "file_name": "a.jpg", "width": 40, "height": 30}]
        written = coco_file(root / split, [annotation(1, [2, 2, 10, 10])], images=images)
        written.rename(root / "annotations" / f"instances_{split}.json")
    build(root)
    sections = json.loads((root / "annotations" / CACHE_NAME).read_text())["sections"]
    assert sections.keys() == {"instances_train2017.json", "instances_val2017.json"}
    assert list(sections["instances_val2017.json"]) == [os.path.join("..", "val2017", "a.jpg")]
    opened.clear()
    build(root)
    assert opened == []


def test_yolo_corrupt_image_fails_or_is_skipped(yolo_dir):
    corrupt = yolo_dir / "train" / "images" / "b.png"
    corrupt.write_bytes(b"\x89PNG garbage")
    with pytest.raises(BadImagesError, match=f"{corrupt}: cannot be opened as an image"):
        build(yolo_dir)
    with pytest.warns(UserWarning, match=r"leaving out 1 bad image file\(s\) \(yolo/train 1\)"):
        splits = build(yolo_dir, skip_bad_images=True)
    assert [r.path.name for r in splits.train.records] == ["a.png"]
    assert [r.path.name for r in splits.valid.records] == ["a.png", "b.png"]
    assert (yolo_dir / CACHE_NAME).is_file()


def test_yolo_truncated_image_is_found_before_mask_labels_read_its_header(yolo_dir):
    truncate(yolo_dir / "valid" / "images" / "a.png")
    with pytest.raises(BadImagesError, match="truncated or corrupt"):
        build_datasets(TrainConfig(dataset_dir=str(yolo_dir), progress_bar=None),
                       ModelConfig(pretrain_weights=None, device="cpu"), masks=True)


def test_a_bad_image_stops_train_before_output_dir_gets_a_file(tmp_path, tiny_kwargs):
    from detrkit import RFDETRNano

    root = roboflow(tmp_path / "data")
    Image.new("RGB", (40, 31)).save(root / "train" / "2.jpg")
    output = tmp_path / "run"
    with pytest.raises(BadImagesError, match="2.jpg: is 40x31"):
        RFDETRNano(**tiny_kwargs).train(dataset_dir=str(root), output_dir=str(output), epochs=1, batch_size=1,
                                        num_workers=0, progress_bar=None, tensorboard=False)
    assert not output.exists() or not any(output.rglob("*"))


def test_skip_bad_images_is_off_by_default():
    assert TrainConfig(dataset_dir=None).skip_bad_images is False


def test_an_image_that_breaks_after_the_check_is_named_when_read(tmp_path):
    root = roboflow(tmp_path / "data")
    splits = build(root)
    (root / "train" / "0.jpg").unlink()
    truncate(root / "train" / "1.jpg")
    # the loader names the sample (SampleLoadError, a ValueError) around the reader's FileNotFoundError
    with pytest.raises(SampleLoadError, match=f"FileNotFoundError.*{root / 'train' / '0.jpg'}.*image id 0.*skip_bad_images=True"):
        splits.train[0]
    with pytest.raises(ValueError, match=f"cannot decode image {root / 'train' / '1.jpg'}.*image id 1"):
        splits.train[1]
    assert splits.train[2][1].image_id == 2


def test_skip_bad_images_stands_the_next_readable_image_in_for_one_that_broke(tmp_path):
    root = roboflow(tmp_path / "data")
    splits = build(root, skip_bad_images=True)
    (root / "train" / "0.jpg").unlink()
    truncate(root / "train" / "1.jpg")
    with pytest.warns(UserWarning) as caught:
        assert splits.train[0][1].image_id == 2
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert messages[0].startswith(f"skip_bad_images=True: image file not found: {root / 'train' / '0.jpg'};")
    assert messages[1].startswith(f"skip_bad_images=True: cannot decode image {root / 'train' / '1.jpg'}:")
    truncate(root / "train" / "2.jpg")
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="none of the 3 images of this split can be read"):
        splits.train[0]


def test_training_goes_on_past_an_image_deleted_after_the_check(tmp_path, tiny_kwargs):
    import pytorch_lightning as pl

    from detrkit import RFDETRNano

    root = roboflow(tmp_path / "data")
    gone = root / "train" / "1.jpg"

    class DeleteAtStart(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            gone.unlink()

    output = tmp_path / "run"
    with pytest.warns(UserWarning, match=f"skip_bad_images=True: image file not found: {gone}"):
        RFDETRNano(**tiny_kwargs).train(dataset_dir=str(root), output_dir=str(output), epochs=1, batch_size=1,
                                        num_workers=0, progress_bar=None, tensorboard=False, skip_bad_images=True,
                                        callbacks=[DeleteAtStart()])
    assert (output / "last.ckpt").is_file() and (output / "checkpoint_best_total.pth").is_file()
