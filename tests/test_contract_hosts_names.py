"""The one rule for a model's display name, and the one test of a loopback peer."""

from specdash.contract.hosts import is_loopback_address
from specdash.contract.names import display_name


def test_a_model_is_named_by_its_file_stem_or_as_given():
    assert display_name("qwen2.5-coder-1.5b") == "qwen2.5-coder-1.5b"
    assert display_name("/models/Qwen2.5-Coder-1.5B-Q4_K_M.gguf") == "Qwen2.5-Coder-1.5B-Q4_K_M"
    assert display_name("model.gguf") == "model"
    assert display_name(r"C:\models\tiny.gguf") == "tiny"
    # A watched server with no model known yet is named by its address, port and all.
    assert display_name("http://127.0.0.1:41655") == "http://127.0.0.1:41655"
    assert display_name("/srv/models/qwen2.5-coder-0.5b") == "qwen2.5-coder-0.5b"


def test_a_loopback_peer_is_any_127_address_or_v6_loopback_never_a_lan_one():
    for addr in ("127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"):
        assert is_loopback_address(addr), addr
    for addr in ("10.0.0.2", "192.168.1.5", "::ffff:10.0.0.2", "", None, "localhost"):
        assert not is_loopback_address(addr), addr
