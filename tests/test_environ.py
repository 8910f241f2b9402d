"""environ.setting: the names it sets are put back as they were, unset ones unset, however the block ends."""

import os

import pytest

from ccbridge import environ


def test_setting_puts_every_name_back_as_it_was_even_when_the_block_raises(monkeypatch):
    monkeypatch.setenv("CCB_TEST_SET", "before")
    monkeypatch.delenv("CCB_TEST_UNSET", raising=False)
    with pytest.raises(RuntimeError):
        with environ.setting({"CCB_TEST_SET": "during", "CCB_TEST_UNSET": "during"}):
            assert os.environ["CCB_TEST_SET"] == os.environ["CCB_TEST_UNSET"] == "during"
            raise RuntimeError
    assert os.environ["CCB_TEST_SET"] == "before" and "CCB_TEST_UNSET" not in os.environ
    with environ.setting({}):  # nothing to set: nothing changes
        assert os.environ["CCB_TEST_SET"] == "before"
