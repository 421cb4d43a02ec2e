import re

import pytest
import yaml

from medattn.config import DEFAULTS, MAX_CONFIG_BYTES, config_yaml, load_config, packaged_configs
from medattn.errors import UserError


def test_defaults_then_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("data: {kind: synthetic_cxr, size: 64}\ntrain: {lr: 3e-4, epochs: 5}\n")
    config = load_config(str(path), ["train.epochs=7", "model.attention=seqnorm", "data.size=[32, 32]",
                                     "model.kwargs.drop_rate=0.1"])
    assert config["train"]["lr"] == 3e-4 and config["train"]["epochs"] == 7
    assert config["train"]["batch_size"] == DEFAULTS["train"]["batch_size"]
    assert config["data"] == {"kind": "synthetic_cxr", "size": [32, 32]}
    assert config["model"]["attention"] == "seqnorm" and config["model"]["kwargs"] == {"drop_rate": 0.1}
    (tmp_path / "resolved.yaml").write_text(config_yaml(config))
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text()) == config


def test_unknown_keys_and_bad_values_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="unknown config key 'train.lrr'"):
        load_config(None, ["data.kind=x", "train.lrr=1"])
    path = tmp_path / "c.yaml"
    path.write_text("data: {kind: x}\ntrian: {lr: 1}\n")
    with pytest.raises(UserError, match="c.yaml: unknown config key 'trian'"):
        load_config(str(path))
    with pytest.raises(UserError, match="train.epochs must be an integer from 1 to"):
        load_config(None, ["data.kind=x", "train.epochs=two"])
    with pytest.raises(UserError, match="not of the form key.sub=value"):
        load_config(None, ["data.kind"])
    with pytest.raises(UserError, match="needs a data section with a 'kind'"):
        load_config(None, [])
    with pytest.raises(UserError, match="train.precision must be one of"):
        load_config(None, ["data.kind=x", "train.precision=fp8"])


def test_missing_file_and_yaml_code_are_refused(tmp_path):
    with pytest.raises(UserError, match="config file not found: nope.yaml"):
        load_config("nope.yaml")
    path = tmp_path / "evil.yaml"
    path.write_text("data: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(str(path))


def test_packaged_configs_load():
    names = packaged_configs()
    for expected in ("synthetic_cxr", "synthetic_breast_mri", "synthetic_wsi", "vindr_cxr_224", "vindr_cxr_1024",
                     "airogs", "isic", "duke", "tcga_nsclc"):
        assert expected in names
    for name in names:
        assert load_config(name)["data"]["kind"]


@pytest.mark.parametrize("override, key", [
    ("eval.bootstrap=-5", "eval.bootstrap"), ("eval.bootstrap=1.5", "eval.bootstrap"), ("eval.ci=x", "eval.ci"),
    ("eval.ci=1", "eval.ci"), ("train.betas=x", "train.betas"), ("train.betas=[0.9, 1.0]", "train.betas"),
    ("train.device=foo", "train.device"), ("train.device=cuda:x", "train.device"),
    ("train.threads=-1", "train.threads"),
    ("train.threads=0", "train.threads"), ("train.warmup_epochs=.inf", "train.warmup_epochs"), ("model=3", "model"),
    ("model.name=[1]", "model.name"), ("model.kwargs=[1]", "model.kwargs"), ("train.lr=.nan", "train.lr"),
    ("train.lr=.inf", "train.lr"), ("train.lr=-1e-3", "train.lr"), ("train.lr=0", "train.lr"),
    ("train.min_lr=-1", "train.min_lr"), ("train.epochs=0", "train.epochs"), ("train.epochs=true", "train.epochs"),
    ("train.batch_size=0", "train.batch_size"), ("train.eval_batch_size=0", "train.eval_batch_size"),
    ("train.grad_clip=-1", "train.grad_clip"), ("train.grad_accum=0", "train.grad_accum"),
    ("train.num_workers=-1", "train.num_workers"), ("train.skip_bad=maybe", "train.skip_bad"), ("seed=-1", "seed"),
    ("seed=2.5", "seed"), ("name=", "name"), ("name=2020-01-01", "name"), ("train=3", "train"), ("eval=[]", "eval"),
    ("data.when=2020-01-01", "data.when"), ("model.kwargs.when=2020-01-01 10:00:00", "model.kwargs.when"),
    ("data.kind=3", "data.kind"),
])
def test_values_of_the_wrong_type_or_range_name_the_key(override, key):
    with pytest.raises(UserError, match=rf"^{re.escape(key)}\b") as error:
        load_config(None, ["data.kind=x", override])
    assert "\n" not in str(error.value)


def test_good_values_pass_and_an_empty_section_keeps_its_defaults(tmp_path):
    config = load_config(None, ["data.kind=x", "train.device=cuda:1", "train.threads=null", "train.grad_clip=null",
                                "eval.bootstrap=0", "train.betas=[0, 0.5]", "train.warmup_epochs=0"])
    assert config["train"]["device"] == "cuda:1" and config["eval"]["bootstrap"] == 0
    path = tmp_path / "c.yaml"
    path.write_text("data: {kind: x}\ntrain:\neval:\n")
    assert load_config(str(path))["train"] == DEFAULTS["train"]


def _alias_bomb(levels: int) -> str:
    """The "billion laughs": each level is a list of nine aliases of the one before (9**levels strings)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"l{i}: &l{i} [{','.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "data:\n  kind: x\n  " + "\n  ".join(lines) + "\n"


def test_yaml_alias_bomb_recursion_and_huge_files_are_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(_alias_bomb(8))  # 9**9 = 387 million strings once expanded
    assert path.stat().st_size < 500
    with pytest.raises(UserError, match="c.yaml: refused: the document's aliases expand to more than"):
        load_config(str(path))
    path.write_text(_alias_bomb(3))  # a few thousand values: aliases used as YAML intends still load
    assert len(load_config(str(path))["data"]["l3"]) == 9
    path.write_text("data: &d {kind: x, me: *d}\n")
    with pytest.raises(UserError, match="c.yaml: refused: an alias refers to a value that contains it"):
        load_config(str(path))
    path.write_text("data: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UserError, match="c.yaml: refused: the document is nested too deeply"):
        load_config(str(path))
    path.write_text("data: {kind: x}\n" + "#" * MAX_CONFIG_BYTES)
    with pytest.raises(UserError, match="c.yaml: a config file may hold at most"):
        load_config(str(path))
    path.write_bytes(b"data: {kind: \xff}\n")
    with pytest.raises(UserError, match="c.yaml: not a text file"):
        load_config(str(path))
    with pytest.raises(UserError, match="refused: the document's aliases expand"):
        load_config(None, ["data.kind=x", "data.x=" + _alias_bomb(8).replace("\n  ", ", ").replace(
            "data:, kind: x, ", "{").rstrip() + "}"])


def test_relative_paths_in_a_config_file_are_relative_to_its_folder(tmp_path, monkeypatch):
    """Wherever the command runs; overrides on the command line stay relative to the current folder, and a table
    that is not found names the folder it was looked for in."""
    from medattn.data import build_datasets
    from medattn.errors import UserError

    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "c.yaml").write_text("data: {kind: image_table, csv: tables/labels.csv, "
                                               "label_columns: [y]}\n")
    monkeypatch.chdir(tmp_path)
    config = load_config("study/c.yaml")
    assert config["data"]["csv"] == str(tmp_path / "study" / "tables" / "labels.csv")
    assert load_config("study/c.yaml", ["data.csv=other.csv"])["data"]["csv"] == "other.csv"
    with pytest.raises(UserError, match=r"other.csv: file not found \(looked at .*/other.csv\)"):
        build_datasets({**config["data"], "csv": "other.csv"})
    assert load_config("synthetic_slides")["data"]["feature_dir"] == "demo/features"  # packaged: unchanged


def test_diffusion_keys_exist_only_in_diffusion_configs(tmp_path):
    """A supervised config holds no diffusion section (nor writes one) and refuses a diffusion key in one line
    naming it; a diffusion config gets every diffusion default under the values set."""
    from medattn.config import validate, with_defaults

    supervised = load_config("synthetic_cxr")
    assert "diffusion" not in supervised and "diffusion" not in DEFAULTS
    (tmp_path / "config.yaml").write_text(config_yaml(supervised))
    assert "diffusion" not in yaml.safe_load((tmp_path / "config.yaml").read_text())
    for source, overrides in ((None, ["data.kind=x", "diffusion.timesteps=3"]),
                              ("synthetic_brain_vqae", ["task=supervised", "diffusion.temperature=0.5"])):
        with pytest.raises(UserError, match=r"^diffusion\.\w+: a key of the diffusion_vqae and diffusion_transformer "
                                            r"tasks only; this config's task is 'supervised'$"):
            load_config(source, overrides)
    path = tmp_path / "c.yaml"
    path.write_text("data: {kind: x}\ndiffusion:\n")  # an empty section sets nothing
    assert "diffusion" not in load_config(str(path))
    # the config.yaml of a run written while every config held the section: its defaults are dropped, not refused
    written = {**supervised, "diffusion": load_config(None, ["data.kind=x", "task=diffusion_vqae"])["diffusion"]}
    (tmp_path / "old_run.yaml").write_text(config_yaml(written))
    assert load_config(str(tmp_path / "old_run.yaml")) == supervised
    with pytest.raises(UserError, match="^diffusion.timesteps: a key of"):
        validate({**supervised, "diffusion": {"timesteps": 3}})

    stage2 = load_config(None, ["data.kind=x", "task=diffusion_transformer", "diffusion.timesteps=3"])
    assert stage2["diffusion"]["timesteps"] == 3 and stage2["diffusion"]["temperature"] == 0.8
    assert list(stage2)[-1] == "diffusion"
    with pytest.raises(UserError, match="^diffusion.temperature must be"):
        validate({**stage2, "diffusion": {k: v for k, v in stage2["diffusion"].items() if k != "temperature"}})
    # a supervised checkpoint saved while every config held the diffusion section loads without it
    old = {**supervised, "diffusion": dict(stage2["diffusion"])}
    assert with_defaults(old) == supervised
    assert with_defaults({k: v for k, v in stage2.items() if k != "diffusion"})["diffusion"] == \
        load_config(None, ["data.kind=x", "task=diffusion_transformer"])["diffusion"]
