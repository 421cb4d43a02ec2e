import pytest
import yaml

from medattn.config import DEFAULTS, load_config, packaged_configs, save_config
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
    save_config(config, tmp_path / "resolved.yaml")
    assert yaml.safe_load((tmp_path / "resolved.yaml").read_text()) == config


def test_unknown_keys_and_bad_values_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="unknown config key 'train.lrr'"):
        load_config(None, ["data.kind=x", "train.lrr=1"])
    path = tmp_path / "c.yaml"
    path.write_text("data: {kind: x}\ntrian: {lr: 1}\n")
    with pytest.raises(UserError, match="c.yaml: unknown config key 'trian'"):
        load_config(str(path))
    with pytest.raises(UserError, match="train.epochs must be a positive integer"):
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
