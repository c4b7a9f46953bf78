"""--sft-mock-dataset-config-json parsing and sampling (torch-free)."""

import json
import subprocess
import sys

import numpy as np
import pytest

from megatron.varlen.packing.length_distributions import parse_length_config, read_lengths_file

FLAG = "--sft-mock-dataset-config-json"
LOGNORMAL = {"mode": "distribution", "type": "lognormal", "min_seq_len": 128,
             "max_seq_len": 8192, "mean_seq_len": 1024, "lognormal_sigma": 1.5}


def test_default_is_upstreams_lognormal():
    config = parse_length_config(None, 4096)
    assert config.spec["min_seq_len"] == 2048 and config.spec["max_seq_len"] == 4096
    assert config.spec["mean_seq_len"] == 3072 and config.spec["lognormal_sigma"] == 1.1
    lengths = config.sample(1000, seed=0)
    assert lengths.dtype == np.int64 and lengths.min() >= 2048 and lengths.max() <= 4096


def test_lognormal_mean_and_determinism():
    config = parse_length_config(json.dumps(LOGNORMAL), 1)
    sample = config.sample(200_000, seed=3)
    assert np.array_equal(sample, config.sample(200_000, seed=3))
    assert not np.array_equal(sample[:100], config.sample(100, seed=4))
    unclipped = parse_length_config({**LOGNORMAL, "min_seq_len": 1, "max_seq_len": 10**9}, 1)
    assert unclipped.sample(400_000, seed=1).mean() == pytest.approx(1024, rel=0.03)
    assert sample.min() >= 128 and sample.max() <= 8192


def test_median_cap_fraction_pareto_uniform_mixture():
    rl = parse_length_config({"mode": "distribution", "type": "lognormal", "min_seq_len": 1,
                              "max_seq_len": 8192, "median_seq_len": 700,
                              "lognormal_sigma": 0.9, "cap_fraction": 0.1}, 1).sample(100_000, 0)
    assert (rl == 8192).mean() == pytest.approx(0.1, abs=0.01)
    assert np.median(rl[rl < 8192]) == pytest.approx(700, rel=0.05)
    pareto = parse_length_config({"mode": "distribution", "type": "pareto", "min_seq_len": 256,
                                  "max_seq_len": 32768, "pareto_alpha": 1.2}, 1).sample(50_000, 0)
    assert pareto.min() == 256 and pareto.max() <= 32768
    assert (pareto > 2560).mean() == pytest.approx(10 ** -1.2, rel=0.1)
    mixture = parse_length_config({"mode": "distribution", "type": "mixture", "components": [
        {"weight": 999, "type": "uniform", "min_seq_len": 900, "max_seq_len": 1100},
        {"weight": 1, "type": "uniform", "min_seq_len": 36000, "max_seq_len": 38000}]}, 1)
    draws = mixture.sample(200_000, 1)
    assert (draws > 30000).mean() == pytest.approx(0.001, rel=0.25)
    assert mixture.max_length == 38000


def test_file_mode_header_cycling_and_relative_path(tmp_path):
    (tmp_path / "lengths.csv").write_text("seq_len\n10\n20\n\n30\n")
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps({"mode": "file", "path": "lengths.csv"}))
    config = parse_length_config(str(config_path), 1)
    assert config.sample(7, seed=99).tolist() == [10, 20, 30, 10, 20, 30, 10]
    assert read_lengths_file(str(tmp_path / "lengths.csv")) == [10, 20, 30]


@pytest.mark.parametrize("header", ["", "seq_len\r\n"])
def test_file_with_byte_order_mark_and_crlf_keeps_every_length(tmp_path, header):
    """A spreadsheet's CSV export (UTF-8 byte order mark, CRLF): the first length is a length,
    not a header to skip (it was dropped), with or without a header line; so is a JSON config
    saved with a byte order mark."""
    (tmp_path / "lengths.csv").write_bytes(
        b"\xef\xbb\xbf" + (header + "10\r\n20\r\n30\r\n").encode())
    assert read_lengths_file(str(tmp_path / "lengths.csv")) == [10, 20, 30]
    config_path = tmp_path / "config.json"
    config_path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"mode": "file",
                                                         "path": "lengths.csv"}).encode())
    assert parse_length_config(str(config_path), 1).sample(4, seed=0).tolist() == [10, 20, 30, 10]


@pytest.mark.parametrize("content, match", [
    ("10\n-3\n", "line 2: length -3 must be positive"),
    ("10\n2.5\n", "line 2: '2.5' is not an integer"),
    ("10\nabc\n", "line 2: 'abc' is not an integer"),
    ("header\n", "contains no lengths"),
])
def test_bad_lengths_files(tmp_path, content, match):
    (tmp_path / "lengths.csv").write_text(content)
    with pytest.raises(ValueError, match=match) as error:
        parse_length_config({"mode": "file", "path": str(tmp_path / "lengths.csv")}, 1)
    assert FLAG in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("value, match", [
    ("{not json", "malformed inline JSON"),
    ("/no/such/config.json", "does not exist"),
    ({"mode": "stream"}, "unknown mode 'stream'"),
    ({"mode": "file", "path": "/no/such/lengths.csv"}, "does not exist"),
    ({**LOGNORMAL, "type": "gamma"}, "unknown distribution type 'gamma'"),
    ({**LOGNORMAL, "min_seq_len": 9000}, "min_seq_len=9000 > max_seq_len=8192"),
    ({**LOGNORMAL, "min_seq_len": 0}, "min_seq_len=0"),
    ({**LOGNORMAL, "max_seq_len": 10.5}, "must be an integer"),
    ({**LOGNORMAL, "median_seq_len": 5}, "exactly one of mean_seq_len / median_seq_len"),
    ({**LOGNORMAL, "lognormal_sigma": -1}, "lognormal_sigma=-1"),
    ({**LOGNORMAL, "cap_fraction": 2}, "cap_fraction=2"),
    ({**LOGNORMAL, "sigma": 1}, "unknown keys \\['sigma'\\]"),
    ({"mode": "distribution", "type": "mixture", "components": []}, "non-empty 'components'"),
    ({**LOGNORMAL, "format": "bshd"}, "format='bshd' .* must be one of \\['thd', 'sbhd'\\]"),
    ({"mode": "verification", "data_path": "/data/tokens"}, "mode 'verification' .* not supported"),
    ({"mode": "distribution", "type": "mixture",  # format is a top-level key only
      "components": [{**LOGNORMAL, "weight": 1, "format": "thd"}]}, "unknown keys \\['format'\\]"),
    (["mode"], "must be JSON text, a path or a dict"),
])
def test_bad_configs_name_value_and_flag(value, match):
    with pytest.raises(ValueError, match=match) as error:
        parse_length_config(value, 1)
    assert FLAG in str(error.value) and "\n" not in str(error.value)


# Megatron-LM's documented SFT mock config (its dataset-config test), verbatim.
UPSTREAM_CONFIG = ('{"mode":"distribution","type":"lognormal","format":"thd",'
                   '"min_seq_len":128,"max_seq_len":2048,"mean_seq_len":512,'
                   '"lognormal_sigma":1.2}')


@pytest.mark.parametrize("layout", ["thd", "sbhd"])
def test_upstream_schema_with_format_is_accepted(layout, tmp_path):
    config = parse_length_config(UPSTREAM_CONFIG.replace('"thd"', f'"{layout}"'), 1)
    assert config.format == layout and config.mode == "distribution"
    assert config.spec["mean_seq_len"] == 512 and config.spec["lognormal_sigma"] == 1.2
    lengths = config.sample(10_000, seed=0)
    assert lengths.min() >= 128 and lengths.max() <= 2048
    # The format changes no length, and file mode takes it too.
    plain = json.loads(UPSTREAM_CONFIG)
    del plain["format"]
    assert np.array_equal(lengths, parse_length_config(plain, 1).sample(10_000, seed=0))
    assert parse_length_config(plain, 1).format is None
    (tmp_path / "lengths.csv").write_text("length\n7\n")
    from_file = parse_length_config({"mode": "file", "path": str(tmp_path / "lengths.csv"),
                                     "format": layout}, 1)
    assert from_file.format == layout and from_file.sample(2, 0).tolist() == [7, 7]


def test_malformed_json_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{"mode": ')
    with pytest.raises(ValueError, match="malformed JSON in"):
        parse_length_config(str(path), 1)


def test_importing_does_not_import_torch():
    code = ("import sys; import megatron.varlen.packing.length_distributions; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60, check=True)
    assert result.stdout.strip() == "False"
