"""Both diffusion stages and inpainting through the command line, end to end on tiny SYNTHETIC volumes."""

import csv
import json
import shutil

import nibabel as nib
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from medattn.cli import main
from medattn.config import load_config
from medattn.data import build_datasets
from medattn.diffusion.losses import load_perceptual_net, vqae_loss
from medattn.errors import UserError
from medattn.generators.synthetic_brain import synthetic_brain

DATA = ["data.size=[16, 16, 32]", "data.num_samples={train: 2, val: 1, test: 1}", "train.threads=1"]
STAGE1 = ["synthetic_brain_vqae", *DATA, "train.epochs=1", "train.batch_size=8", "model.kwargs.patch_size=8",
          "model.kwargs.channels=[4, 4]", "model.kwargs.embed_dim=16", "model.kwargs.codebook_size=8"]
STAGE2 = ["synthetic_brain_transformer", *DATA, "train.epochs=2", "train.batch_size=2", "model.kwargs.dim=16",
          "model.kwargs.depth=1", "model.kwargs.num_heads=2", "diffusion.sample_steps=4"]


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("medattn: error: ")
    return err[0]


def _nifti(path, shape, affine):
    volume = synthetic_brain(shape, np.random.default_rng(7))
    nib.save(nib.Nifti1Image(volume, affine), path)
    return volume


def test_two_stages_and_inpainting_end_to_end(tmp_path, capsys):
    stage1, stage2 = tmp_path / "vqae", tmp_path / "transformer"
    assert main(["train", *STAGE1, "--out", str(stage1)]) == 0
    assert "perceptual term off" in capsys.readouterr().out
    results = json.loads((stage1 / "results.json").read_text())
    assert results["synthetic"] is True and results["task"] == "diffusion_vqae" and -1 <= results["test"]["ssim"] <= 1
    assert (stage1 / "checkpoints/best/model.safetensors").is_file() and (stage1 / "config.yaml").is_file()
    assert main(["train", *STAGE2, "model.attention=binary-sg", f"diffusion.vqae_checkpoint={stage1}",
                 "--out", str(stage2)]) == 0
    assert "SYNTHETIC" in capsys.readouterr().out
    results = json.loads((stage2 / "results.json").read_text())
    assert results["synthetic"] is True and set(results["test"]) >= {"diffusion", "random"}
    assert [r["epoch"] for r in csv.DictReader(open(stage2 / "metrics.csv"))] == ["1", "2"]

    affine = np.array([[0, 1.5, 0, -10], [1.2, 0, 0, 4], [0, 0, 2.0, 7], [0, 0, 0, 1]])
    volume = _nifti(tmp_path / "case.nii.gz", (16, 16, 32), affine)
    out = tmp_path / "out"
    assert main(["inpaint", str(stage2), str(tmp_path / "case.nii.gz"), "--mask", "centre", "--out", str(out)]) == 0
    written = nib.load(out / "case_inpainted.nii.gz")
    assert written.shape == volume.shape and np.allclose(written.affine, affine)
    rows = list(csv.DictReader(open(out / "scores.csv")))
    assert rows[0]["case"] == "case" and rows[0]["method"] == "diffusion" and float(rows[0]["ssim"]) <= 1
    assert int(rows[0]["masked_tokens"]) == 2 * 2 * 4  # half of each axis of the 4 x 4 x 8 token grid
    assert isinstance(results["warnings"], list)  # diffusion against random codes, judged at training's test

    # a first stage whose codes all decode alike: diffusion's output is random codes' output, and it says so
    collapsed = tmp_path / "collapsed"
    shutil.copytree(stage2, collapsed)
    weights = collapsed / "checkpoints/best/model.safetensors"
    tensors = load_file(weights)
    tensors["vqae.codebook.codes"] = torch.zeros_like(tensors["vqae.codebook.codes"])
    with safe_open(str(weights), "pt") as original:
        metadata = original.metadata()
    save_file(tensors, weights, metadata=metadata)
    assert main(["inpaint", str(collapsed), str(tmp_path / "case.nii.gz"), "--out", str(tmp_path / "out2")]) == 0
    assert "WARNING: case.nii.gz: diffusion and random codes decode to the same volume" in capsys.readouterr().out
    mask = np.zeros(volume.shape, np.uint8)
    mask[0, 0, 0] = 1
    nib.save(nib.Nifti1Image(mask, affine), tmp_path / "mask.nii.gz")
    assert main(["inpaint", str(stage1), str(tmp_path / "case.nii.gz"), "--mask", str(tmp_path / "mask.nii.gz"),
                 "--method", "random", "--out", str(out)]) == 2  # the first call's outputs are not replaced ...
    assert "refusing to replace it" in capsys.readouterr().err
    assert main(["inpaint", str(stage1), str(tmp_path / "case.nii.gz"), "--mask", str(tmp_path / "mask.nii.gz"),
                 "--method", "random", "--out", str(out), "--overwrite"]) == 0  # ... unless asked
    assert list(csv.DictReader(open(out / "scores.csv")))[0]["masked_tokens"] == "1"
    assert "WARNING" not in capsys.readouterr().out
    nib.save(nib.Nifti1Image(volume * 1000 - 50, affine), tmp_path / "raw.nii.gz")  # scanner units, not [0, 1]
    assert main(["inpaint", str(stage1), str(tmp_path / "raw.nii.gz"), "--method", "random", "--out",
                 str(tmp_path / "raw_out")]) == 0
    assert "WARNING: raw.nii.gz: values" in capsys.readouterr().out  # PSNR was -54 dB without a word

    # bad input: wrong size, missing checkpoint, a stage-1 checkpoint for diffusion, stage 2 without stage 1
    _nifti(tmp_path / "odd.nii.gz", (16, 12, 32), affine)
    assert "odd.nii.gz" in _error(capsys, ["inpaint", str(stage2), str(tmp_path / "odd.nii.gz"), "--out", str(out)])
    _nifti(tmp_path / "other.nii.gz", (16, 16, 16), affine)
    assert "trained on volumes of size (16, 16, 32)" in _error(
        capsys, ["inpaint", str(stage2), str(tmp_path / "other.nii.gz"), "--out", str(out)])
    assert "does not exist" in _error(capsys, ["inpaint", str(tmp_path / "nothing"), str(tmp_path / "case.nii.gz"),
                                               "--out", str(out)])
    assert "stage-1" in _error(capsys, ["inpaint", str(stage1), str(tmp_path / "case.nii.gz"), "--out", str(out)])
    assert "no checkpoint found" in _error(capsys, ["train", *STAGE2, f"diffusion.vqae_checkpoint={tmp_path}",
                                                    "--out", str(tmp_path / "t2")])


def test_bad_diffusion_configs_answer_in_one_line(tmp_path, capsys):
    assert "not a multiple of the patch size 32" in _error(
        capsys, ["train", "synthetic_brain_vqae", "data.size=[40, 32, 32]", "--out", str(tmp_path / "a")])
    assert "model.name must be 'vqae3d'" in _error(
        capsys, ["train", "synthetic_brain_vqae", "model.name=vit2d_tiny", "--out", str(tmp_path / "b")])
    assert "diffusion.vqae_checkpoint" in _error(
        capsys, ["train", "synthetic_brain_transformer", "diffusion.vqae_checkpoint=null", "--out", str(tmp_path)])
    assert "diffusion.temperature must be" in _error(
        capsys, ["train", "synthetic_brain_transformer", "diffusion.temperature=0", "--out", str(tmp_path)])
    assert "--resume" in _error(capsys, ["train", "synthetic_brain_vqae", "--resume", "--out", str(tmp_path / "c")])
    assert "perceptual_net" in _error(
        capsys, ["train", "synthetic_brain_vqae", "diffusion.perceptual_weight=1", "--out", str(tmp_path / "d")])


def test_the_unlabelled_volumes_are_registered_kinds_that_only_diffusion_trains_on(tmp_path, capsys):
    """synthetic_brain and nifti_volumes are data kinds of the registry whose bundles carry no labels: a supervised
    run refuses them in one line, and a diffusion stage refuses a labelled kind."""
    from medattn.catalogue import DATA_KINDS, UNLABELLED_KINDS

    assert set(UNLABELLED_KINDS) <= set(DATA_KINDS)
    bundle = build_datasets({"kind": "synthetic_brain", "size": [8, 8, 8], "num_samples": [2, 1, 1]})
    assert (bundle.task.task_type, bundle.task.num_outputs, bundle.task.input_shape) == ("unlabelled", 0, (1, 8, 8, 8))
    assert "label" not in bundle.train[0]
    (tmp_path / "c.yaml").write_text("data: {kind: synthetic_brain, size: [8, 8, 8], num_samples: [2, 1, 1]}\n"
                                     "model: {name: vit3d_tiny}\ntrain: {epochs: 1, threads: 1}\n")
    assert "unlabelled volumes" in _error(capsys, ["train", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "a"),
                                                   "--no-progress"])
    assert "the diffusion tasks read synthetic_brain, nifti_volumes, got 'synthetic_cxr'" in _error(
        capsys, ["train", "synthetic_brain_vqae", "data={kind: synthetic_cxr}", "--out", str(tmp_path / "b")])


def test_nifti_volume_table_and_its_errors(tmp_path):
    affine = np.eye(4)
    for i in range(4):
        _nifti(tmp_path / f"v{i}.nii.gz", (20, 16, 16), affine)
    (tmp_path / "table.csv").write_text("path,split\n" + "".join(f"v{i}.nii.gz,{s}\n" for i, s in
                                                                   enumerate(["train", "train", "val", "test"])))
    sets = build_datasets({"kind": "nifti_volumes", "csv": str(tmp_path / "table.csv"), "split_column": "split",
                           "target_size": [16, 16, 16]})
    assert (len(sets.train), len(sets.val), len(sets.test), sets.task.synthetic) == (2, 1, 1, False)
    sample = sets.train[0]["input"]
    assert sample.shape == (1, 16, 16, 16) and 0 <= float(sample.min()) and float(sample.max()) <= 1
    (tmp_path / "bad.csv").write_text("path\nmissing.nii.gz\n")
    with pytest.raises(UserError, match="bad.csv row 2: .*missing.nii.gz does not exist"):
        build_datasets({"kind": "nifti_volumes", "csv": str(tmp_path / "bad.csv")})
    with pytest.raises(UserError, match="does not take labels"):
        build_datasets({"kind": "synthetic_brain", "labels": 1})


def test_synthetic_volumes_are_deterministic_and_brain_like():
    config = load_config("synthetic_brain_vqae")
    a, b = build_datasets(config["data"], 0), build_datasets(config["data"], 0)
    volume = a.train[0]["input"]
    assert torch.equal(volume, b.train[0]["input"]) and not torch.equal(volume, a.train[1]["input"])
    assert volume.shape == (1, 64, 96, 64) and a.task.synthetic
    centre, corner = volume[0, 28:36, 44:52, 28:36].mean(), volume[0, :4, :4, :4].mean()
    assert centre > 0.3 and corner < 0.1  # tissue in the middle, air in the corners


def test_perceptual_term_from_a_local_export_and_the_gradient_term(tmp_path):
    net = torch.nn.Conv2d(1, 2, 3)
    batch = torch.export.Dim("batch")
    program = torch.export.export(net, (torch.randn(3, 1, 8, 8),), dynamic_shapes=({0: batch},))
    torch.export.save(program, tmp_path / "net.pt2")
    loaded = load_perceptual_net(tmp_path / "net.pt2")
    recon, target = torch.rand(2, 1, 8, 8, 8, requires_grad=True), torch.rand(2, 1, 8, 8, 8)
    total, parts = vqae_loss(recon, target, torch.tensor(0.5), loaded, 1.0, 2.0)
    slices = lambda v: torch.cat([v[:, :, 4], v[:, :, :, 4], v[:, :, :, :, 4]])  # noqa: E731
    perceptual = (net(slices(recon)) - net(slices(target))).abs().mean()
    assert parts["perceptual"] == pytest.approx(float(perceptual), rel=1e-5)
    assert float(total) == pytest.approx(parts["l1"] + 0.5 + parts["perceptual"] + 2 * parts["gradient"], rel=1e-5)
    total.backward()
    assert recon.grad.abs().sum() > 0
    (tmp_path / "junk.pt2").write_bytes(b"not a program")
    with pytest.raises(UserError, match="not a torch.export program"):
        load_perceptual_net(tmp_path / "junk.pt2")


def test_diffusion_no_better_than_random_codes_is_said():
    from medattn.diffusion.inpaint import versus_random

    better, worse = {"psnr_masked": 18.0}, {"psnr_masked": 12.0}
    assert versus_random(better, worse, identical=False) is None
    assert "no better than random codes inside the mask (PSNR 12.00 vs 18.00 dB)" in versus_random(worse, better, False)
    assert "no better" in versus_random(worse, worse, False)  # a tie is no better
    assert "decode to the same volume" in versus_random(better, worse, identical=True)


def test_the_diffusion_summary_is_boxed_like_a_supervised_run(tmp_path):
    from medattn.diffusion.train import diffusion_summary

    text = diffusion_summary({"task": "diffusion_transformer", "synthetic": True, "volume_shape": [16, 16, 32],
                              "best_epoch": 2, "test": {"diffusion": {"psnr": 21.5, "ssim": 0.7},
                                                        "random": {"psnr": 14.0, "ssim": 0.2}}}, tmp_path)
    lines = text.splitlines()
    assert lines[0] == lines[-1] == "=" * 72 and "{" not in text and "SYNTHETIC" in lines[1]
    assert "test diffusion psnr" in text and "21.5000" in text and "test random ssim" in text



@pytest.fixture(scope="module")
def stage1(tmp_path_factory):
    """A tiny first-stage (VQ-AE) run: enough for `inpaint --method random`."""
    run = tmp_path_factory.mktemp("vqae") / "run"
    assert main(["train", *STAGE1, "--out", str(run), "--no-progress"]) == 0
    return run


def test_inpaint_gives_volumes_of_one_name_distinct_outputs(stage1, tmp_path):
    """Volumes of one name from several folders: each its own outputs and scores row, also when one input's own
    name is another's numbered stem (``x_2``) or differs only in case."""
    volumes = []
    for name in ("a/x.nii.gz", "b/x.nii.gz", "c/x_2.nii.gz", "d/X.nii"):
        (tmp_path / name).parent.mkdir()
        _nifti(tmp_path / name, (16, 16, 32), np.eye(4))
        volumes.append(str(tmp_path / name))
    out = tmp_path / "out"
    assert main(["inpaint", str(stage1), *volumes, "--method", "random", "--out", str(out)]) == 0
    cases = [row["case"] for row in csv.DictReader(open(out / "scores.csv"))]
    assert cases == ["x", "x_2", "x_2_2", "X_3"]
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["scores.csv", *(f"{case}_{kind}.nii.gz" for case in cases for kind in ("inpainted", "mask"))])


def test_inpaint_names_a_truncated_mask_or_volume_in_one_line(stage1, tmp_path, capsys):
    """A NIfTI file cut short inside its header ended in nibabel's ImageFileError traceback."""
    volume = tmp_path / "case.nii.gz"
    _nifti(volume, (16, 16, 32), np.eye(4))
    mask = np.zeros((16, 16, 32), np.uint8)
    mask[0, 0, 0] = 1
    nib.save(nib.Nifti1Image(mask, np.eye(4)), tmp_path / "mask.nii.gz")
    whole = (tmp_path / "mask.nii.gz").read_bytes()
    for name, cut in (("head.nii.gz", 40), ("half.nii.gz", len(whole) // 2)):
        (tmp_path / name).write_bytes(whole[:cut])
        for argv in (["--mask", str(tmp_path / name), str(volume)], [str(tmp_path / name)]):  # a mask, a volume
            err = _error(capsys, ["inpaint", str(stage1), *argv, "--method", "random", "--out", str(tmp_path / "o")])
            assert f"{tmp_path / name}: unreadable NIfTI" in err
    assert not (tmp_path / "o").exists()
