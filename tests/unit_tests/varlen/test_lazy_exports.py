"""lazy_exports: a package's public names imported on first access (PEP 562), and the packages
outside megatron.varlen that build their ``__getattr__`` with it (the training layer's datasets,
the facade) keep the public surface they had when each hand-rolled its own."""

import importlib
import sys

import pytest

from megatron.varlen.lazy_exports import lazy_exports

# Their public names as callers and docs use them (docs/WRAP.md, tools/preprocess_data.py,
# the training layer), written out here so that a name lost from a package's table fails.
DATASETS_NAMES = ["ArrowSFTDataset", "EpochDataset", "IndexedGPTSamples", "MockGPTDataset",
                  "MockSFTDataset", "SFTDataset", "build_datasets", "collate_padded",
                  "get_pad_multiple", "make_sample"]
WRAP_NAMES = ["ConfigError", "Flow", "FlowContext", "GPTFlow", "GPTSFTFlow", "MegatronWrap",
              "MockFlow", "PER_SAMPLE", "build_config", "config_path", "get_flow_class",
              "register_flow", "registered_flows"]
PACKAGES = {"megatron.varlen_training.datasets": DATASETS_NAMES, "megatron.wrap": WRAP_NAMES}


def test_a_name_is_imported_on_first_access_and_a_module_name_exports_the_module():
    sys.modules.pop("colorsys", None)
    getattr_ = lazy_exports("pkg", {"rgb_to_hsv": "colorsys", "colorsys": "colorsys"})
    assert "colorsys" not in sys.modules  # building the hook imports nothing
    rgb_to_hsv = getattr_("rgb_to_hsv")
    colorsys = sys.modules["colorsys"]
    assert rgb_to_hsv is colorsys.rgb_to_hsv
    assert getattr_("colorsys") is colorsys


def test_an_unknown_name_is_an_attribute_error_naming_the_package():
    getattr_ = lazy_exports("pkg", {"rgb_to_hsv": "colorsys"})
    with pytest.raises(AttributeError, match=r"^module 'pkg' has no attribute 'hsv'$"):
        getattr_("hsv")


@pytest.mark.parametrize("package_name", sorted(PACKAGES))
def test_each_public_name_is_the_defining_modules_object(package_name):
    package = importlib.import_module(package_name)
    assert package.__all__ == PACKAGES[package_name]
    for name in package.__all__:
        defining = importlib.import_module(package._EXPORTS[name])
        assert defining.__name__.startswith(package_name + ".")
        assert getattr(package, name) is getattr(defining, name), name


@pytest.mark.parametrize("package_name", sorted(PACKAGES))
def test_an_unknown_name_fails_as_a_missing_attribute(package_name):
    package = importlib.import_module(package_name)
    with pytest.raises(AttributeError,
                       match=rf"^module '{package_name}' has no attribute 'NoSuchName'$"):
        package.NoSuchName  # noqa: B018
    assert not hasattr(package, "NoSuchName")
    with pytest.raises(ImportError, match="NoSuchName"):
        exec(f"from {package_name} import NoSuchName", {})


def test_the_facade_lists_its_lazy_names_in_dir():
    import megatron.wrap

    listed = dir(megatron.wrap)
    assert set(WRAP_NAMES) <= set(listed)
    assert "silence_known_warnings" in listed  # the module's own globals stay listed
