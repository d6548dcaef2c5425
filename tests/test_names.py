"""The cache format's names (tasks/entries/names.py), each rule on its own: pure string arithmetic, tested directly
rather than only through whole converts. The expected strings are written out here, as cache/README.md shows them."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from tasks.entries.names import (chunk_file, chunk_key, entry_key, entry_name, holds_data, is_temporary, manifest_key,
                                 packed_path, ref_key, scratch_name, set_aside_name, slot_of, tmp_name, tmp_owner)


def test_every_temporary_name_is_temporary_and_no_published_one_is():
    published = entry_name("n16", "tt-n16", "port", "ab" * 32)
    assert published == "n16-tt-n16-port-" + "ab" * 10 and not is_temporary(published)
    building, check = tmp_name(published, 4242, "deadbeef"), scratch_name(published, 4242)
    assert building == published + ".tmp-4242-deadbeef" and is_temporary(building)
    assert check == ".tmp-4242-check-" + published and is_temporary(check)
    aside = set_aside_name(published, 4242)  # --force's published entry, moved out of the way of its replacement
    assert aside == published + ".tmp-4242-replaced" and is_temporary(aside)
    assert tmp_owner(building) == tmp_owner(check) == tmp_owner(aside) == 4242 and tmp_owner(published) is None


def test_keys_under_the_cache_root():
    assert entry_key("e") == "entries/e" and manifest_key("e") == "entries/e/MANIFEST.json"
    assert ref_key("n17", "generic", "bf16") == "refs/n17-generic-bf16.json"
    assert ref_key("n17", "generic", "bf16", synthetic=True) == "refs/n17-generic-bf16.synthetic.json"


def test_chunks_and_device_files_of_whole_arrays_and_of_bank_slots():
    entry = PurePosixPath("entries/e")
    assert str(chunk_file(entry, "dit.proj_out_1.weight", 2, None)) == "entries/e/dit.proj_out_1.weight/c.0.0"
    assert str(chunk_file(entry, "action_encoder.W1.W", 2, 7)) == "entries/e/action_encoder.W1.W/c.7.0.0"
    assert str(chunk_file(Path("/c/entries/e"), "b", 1, 3)) == "/c/entries/e/b/c.3.0"
    assert str(packed_path(entry, "action_encoder.W1.W", 7)) == "entries/e/tensorbin/action_encoder.W1.W@7.tensorbin"
    assert str(packed_path(entry, "dit.x", None)) == "entries/e/tensorbin/dit.x.tensorbin"
    assert [chunk_key(s) for s in (None, 0, 31)] == ["all", "0", "31"]
    assert [slot_of(k) for k in ("all", "0", "31")] == [None, 0, 31]


def test_an_entrys_data_objects_are_its_chunks_and_device_files_and_nothing_else():
    """What a resumed push into a bucket finds already there and does not send again; documents are put again."""
    entry = PurePosixPath("entries/e")
    data = [chunk_file(entry, "dit.proj_out_1.weight", 2, None), chunk_file(entry, "action_encoder.W1.W", 2, 7),
            chunk_file(entry, "scalar", 0, None), packed_path(entry, "action_encoder.W1.W", 7),
            packed_path(entry, "dit.x", None)]
    assert str(data[2]) == "entries/e/scalar/c" and all(holds_data(str(k)) for k in data)
    others = ["entries/e/zarr.json", "entries/e/dit.x/zarr.json", manifest_key("e"), manifest_key("e") + ".bak",
              "entries/e/tensorbin/dit.x.tensorbin.1f2e.partial", "entries/e/dit.x/cache.bin", "entries/e/x.tensorbin"]
    assert not any(holds_data(k) for k in others)
