"""The OpenAPI document is derived from the core: every policy field and every config key, with
its help text, bounds and choices, and strict JSON types (no server needed)."""

import dataclasses
import typing

import pytest
from pydantic import ValidationError

from asteria_core.fields import settings_of
from asteria_core.policy import Policy, policy_fields
from asteria_core.train.config import RunConfig
from backend.app import create_app
from backend.schemas import PolicyUpdate, RunCreate
from backend.settings import Settings


@pytest.fixture(scope="module")
def schemas():
    return create_app(Settings(start_default_run=False)).openapi()["components"]["schemas"]


def test_every_policy_field_is_documented_with_its_bounds_or_choices(schemas):
    update = schemas["PolicyUpdate"]
    assert update["additionalProperties"] is False and update["minProperties"] == 1
    assert "swap_delay <= staleness_bound" in update["description"]
    props = update["properties"]
    assert list(props) == [f.name for f in policy_fields()]
    for field in policy_fields():
        prop = props[field.name]
        assert (prop["title"], prop["description"]) == (field.title, field.help)
        assert "default" not in prop  # an omitted field keeps its value
        match field.kind:
            case "int":
                assert prop["type"] == "integer"
                assert (prop["minimum"], prop["maximum"]) == (field.minimum, field.maximum)
            case "choice":
                assert prop["enum"] == list(field.choices)
            case "bool":
                assert prop["type"] == "boolean"
            case "str":
                assert (prop["type"], prop["maxLength"]) == ("string", field.max_length)
            case "auto_or_int":
                assert prop["anyOf"] == [
                    {"type": "string", "const": "auto"},
                    {"type": "integer", "minimum": field.minimum, "maximum": field.maximum}]
    initial = schemas["RunPolicy"]
    assert "minProperties" not in initial  # POST /runs may leave the policy empty
    assert initial["properties"]["staleness_bound"]["default"] == Policy().staleness_bound


def test_every_config_key_of_every_section_is_documented(schemas):
    sections = schemas["RunConfigSections"]["properties"]
    hints = typing.get_type_hints(RunConfig)
    assert list(sections) == [f.name for f in dataclasses.fields(RunConfig)]
    for name, cls in ((f.name, hints[f.name]) for f in dataclasses.fields(RunConfig)):
        if cls is Policy:  # described by the policy's own fields (the test above)
            assert sections[name]["$ref"].endswith("/RunPolicy")
            continue
        section = schemas[sections[name]["$ref"].rsplit("/", 1)[-1]]
        assert section["description"] == cls.__doc__
        assert section["additionalProperties"] is False
        keys = [f.name for f in dataclasses.fields(cls)]
        assert list(section["properties"]) == keys
        for setting in settings_of(cls):
            prop = section["properties"][setting.name]
            key = (name, setting.name)
            assert prop["description"] == setting.help and len(setting.help) > 10, key
            assert prop["default"] == (list(setting.default) if isinstance(setting.default, tuple)
                                       else setting.default), (name, setting.name)
            if setting.kind == "int":  # the bounds the section validates with
                assert (prop["minimum"], prop["maximum"]) == (setting.minimum, setting.maximum)
            if setting.kind == "choice":
                assert prop["enum"] == list(setting.choices)
    optim = schemas["OptimConfig"]["properties"]
    assert optim["lr"]["type"] == "number" and optim["betas"]["type"] == "array"
    assert (optim["lr"]["exclusiveMinimum"], optim["lr"]["maximum"]) == (0.0, 10.0)
    assert optim["shampoo_beta"]["minimum"] == -1.0  # -1: use betas[1]
    assert schemas["TrainConfig"]["properties"]["steps"]["type"] == "integer"
    assert "Linux CPU list" in schemas["TrainConfig"]["properties"]["cpus"]["description"]


@pytest.mark.parametrize("body", [{"refresh_interval": True}, {"staleness_bound": "5"},
                                  {"pace": 1}, {"swap_delay": True}, {"workers": 2.0},
                                  {"disk_dir": None}, {"swap_mode": 1}])
def test_policy_types_are_strict(body):
    [(field, _)] = body.items()
    with pytest.raises(ValidationError) as err:
        PolicyUpdate.model_validate(body)
    assert all(e["loc"][0] == field for e in err.value.errors())


@pytest.mark.parametrize(("config", "loc"), [
    ({"train": {"steps": "5"}}, ("config", "train", "steps")),
    ({"model": {"bias": 1}}, ("config", "model", "bias")),
    ({"optim": {"lr": True}}, ("config", "optim", "lr")),
    ({"optim": {"betas": [0.9, "0.95"]}}, ("config", "optim", "betas", 1)),
    ({"trian": {}}, ("config", "trian")),
])
def test_config_types_are_strict(config, loc):
    with pytest.raises(ValidationError) as err:
        RunCreate.model_validate({"config": config})
    assert [e["loc"] for e in err.value.errors()] == [loc]


def test_config_takes_what_a_config_file_takes():
    body = RunCreate.model_validate({"config": {"optim": {"lr": 1, "betas": [0, 0.95]},
                                                "policy": {"swap_delay": "auto"}}})
    assert body.config.model_dump(exclude_unset=True) == {
        "optim": {"lr": 1.0, "betas": (0.0, 0.95)}, "policy": {"swap_delay": "auto"}}
    with pytest.raises(ValidationError, match="less than 1"):  # the setting's bounds
        RunCreate.model_validate({"config": {"optim": {"betas": [0.9, 1]}}})
    # unknown keys reach config_from_dict, whose 422 names the key and lists the allowed ones
    body = RunCreate.model_validate({"config": {"optim": {"lrr": 1}}})
    assert body.config.model_dump(exclude_unset=True) == {"optim": {"lrr": 1}}
