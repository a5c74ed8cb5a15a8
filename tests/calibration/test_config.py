import pytest

from quantkit.calibration.config import FieldMap, SamplerConfig
from quantkit.errors import QuantkitError


def test_bucket_edges_end_at_max_len():
    assert SamplerConfig(max_len=1000).bucket_edges() == (64, 128, 256, 512, 1000)
    assert SamplerConfig(max_len=4096).bucket_edges() == (64, 128, 256, 512, 1024, 2048, 4096)
    assert SamplerConfig(max_len=300, length_edges=(100, 200)).bucket_edges() == (100, 200, 300)


def test_round_trip_with_version():
    cfg = SamplerConfig(num_samples=8, policy="balanced", fields=FieldMap(text="body", task=None))
    data = cfg.to_dict()
    assert data["version"] == 1
    assert SamplerConfig.from_dict(data) == cfg


@pytest.mark.parametrize("data, key", [
    ({"num_sample": 5}, "calibration.num_sample"),
    ({"fields": {"txt": "x"}}, "fields.txt"),
    ({"policy": "random"}, "calibration.policy"),
    ({"length_edges": [128, 64]}, "calibration.length_edges"),
    ({"max_malformed_share": 1.5}, "calibration.max_malformed_share"),
    ({"version": 9}, "calibration.version"),
])
def test_bad_keys_and_values_are_named(data, key):
    with pytest.raises(QuantkitError, match=key.replace(".", r"\.")):
        SamplerConfig.from_dict(data)


def test_calibrate_rejects_unknown_overrides(tmp_path):
    from quantkit.calibration import calibrate

    with pytest.raises(QuantkitError, match="calibration.samples: unknown key"):
        calibrate(tmp_path / "log.jsonl", object(), samples=3)
