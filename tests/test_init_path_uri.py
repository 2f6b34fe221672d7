"""``model.init_path`` by URI (s3://, moto's server here): the driver's preflight reads and
checks the weights through the shared reader (weights_location.fetch, the one curation's
and finetune's --checkpoint use), refuses a misfit in one line naming the URI, and each
worker loads the same weights from its node's cache. Endpoint and keys come only from the
standard AWS environment. No Ray started."""

from __future__ import annotations

import pytest
import torch
from test_pretrain_fail_once import base, uniter_files  # noqa: F401  (fixtures)

from vlp.contract.config_loader import ConfigError
from vlp.platform.cluster import run_storage
from vlp.platform.pretrain.job import load_pretrain_config, resolved
from vlp.platform.pretrain.data import prepare

BUCKET = "init-weights"


@pytest.fixture(scope="module")
def uploaded(s3_server, uniter_files):  # noqa: F811
    s3_server.create_bucket(BUCKET)
    for name in ("good.pt", "width32.pt"):
        s3_server.upload(uniter_files / name, f"{BUCKET}/uniter/{name}")


@pytest.fixture
def node_env(s3_env, uploaded):
    return s3_env


def config(base, path):  # noqa: F811
    return resolved(load_pretrain_config(data=base, overrides=[
        "model.init=uniter", f"model.init_path={path}"]))


def test_init_weights_are_read_from_s3_on_the_driver_and_the_workers(node_env, base,  # noqa: F811
                                                                    uniter_files):  # noqa: F811
    from vlp.models.checkpoints import read_state_dict
    from vlp.platform.pretrain.components import PretrainComponents

    uri = f"s3://{BUCKET}/uniter/good.pt"
    cfg = config(base, uri)
    assert cfg.model.init_path == uri                  # not <cwd>/s3:/...
    setup = prepare(cfg)                                # the preflight: read and fitted
    model = PretrainComponents(setup).build_model(None, list(setup.tasks))
    theirs = read_state_dict(uniter_files / "good.pt")
    key = "uniter.embeddings.word_embeddings.weight"
    torch.testing.assert_close(
        model.state_dict()["backbone.text_embeddings.word_embeddings.weight"], theirs[key])


def test_a_misfit_or_missing_init_file_in_s3_fails_in_one_line_naming_it(
        node_env, base):  # noqa: F811
    uri = f"s3://{BUCKET}/uniter/width32.pt"
    with pytest.raises(ConfigError) as e:
        prepare(config(base, uri))
    msg = str(e.value)
    assert "\n" not in msg and f"model.init_path: {uri} does not fit uniter-tiny" in msg
    assert "img_linear" in msg or "shape" in msg
    missing = f"s3://{BUCKET}/uniter/nothing.pt"
    with pytest.raises(ConfigError, match=f"model.init_path: {missing}: no such file"):
        prepare(config(base, missing))
    assert run_storage.is_uri(missing)


def test_soho_cnn_weights_are_read_from_s3_on_the_driver_and_the_workers(
        s3_env, base, tmp_path):  # noqa: F811
    """``model.cnn_init`` (a torchvision ResNet state dict) by URI, through the same reader:
    checked on the driver, loaded by the workers; a misfit or missing one fails in one line
    naming the URI."""
    from test_soho_recipe import _torchvision_file

    from vlp.models.family_config import ResNetConfig
    from vlp.platform.pretrain.components import PretrainComponents

    good, state = _torchvision_file(tmp_path)
    wide, _ = _torchvision_file(tmp_path, ResNetConfig("basic", (1, 1, 1, 1), 16), "wide.pth")
    s3_env.create_bucket(BUCKET)
    uri = s3_env.upload(good, f"{BUCKET}/cnn/resnet.pth")
    soho = {**base, "model": {"family": "soho-tiny"}, "tasks": {"mlm": 1, "mvm": 1}}

    def soho_config(path: str):
        return resolved(load_pretrain_config(data=soho, overrides=[f"model.cnn_init={path}"]))

    cfg = soho_config(uri)
    assert cfg.model.cnn_init == uri                    # not <cwd>/s3:/...
    setup = prepare(cfg)
    trunk = PretrainComponents(setup).build_model(None, list(setup.tasks)).backbone.visual.resnet
    loaded = [k for k, v in trunk.state_dict().items() if k in state]
    assert len(loaded) == len(state) - 2                # all but torchvision's fc
    assert all(torch.equal(trunk.state_dict()[k], state[k]) for k in loaded)
    for bad, what in ((s3_env.upload(wide, f"{BUCKET}/cnn/wide.pth"), "wrong shape"),
                      (f"s3://{BUCKET}/cnn/nothing.pth", "no such file")):
        with pytest.raises(ConfigError) as e:
            prepare(soho_config(bad))
        msg = str(e.value)
        assert "\n" not in msg and f"model.cnn_init: {bad}: " in msg and what in msg, msg
