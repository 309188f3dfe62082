"""Every module of the package stays under about 400 lines: past that it holds more than one responsibility."""

from pathlib import Path

LIMIT = 400
PACKAGE = Path(__file__).resolve().parents[1] / "softcapgrad"


def test_no_module_past_the_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > LIMIT}
    assert long == {}


def test_the_audit_keeps_its_old_addresses():
    from softcapgrad.models import audit, tiny

    for name in ("Source", "source", "parse_sets", "model_type_config", "directory_config", "read_token_ids",
                 "random_ids", "check_ids", "text_tokens", "vocabulary", "quiet", "smoke", "missing_package",
                 "DISCOVERY", "WEIGHT_FILES", "TOKEN_KINDS", "IMPLEMENTATIONS", "FORMATS", "build", "audit",
                 "audit_model", "example_report", "Batch", "Run", "installed"):
        assert hasattr(audit, name), name
    for name in ("parameters_estimate", "available_bytes", "address_space", "refuse_if_too_big", "size", "Size",
                 "LAYER_COUNTS", "tiny_config", "tiny_dict", "shrink", "reason"):
        assert hasattr(tiny, name), name
