"""Hugging Face folders of encoder-decoder, audio and vision models load with inputs from their config.

Each folder is built here from a transformers config at small sizes with seeded weights and
``save_pretrained(safe_serialization=True)``, then loaded through the explorer's Hugging Face source:
T5 (an encoder-decoder: token ids, their mask and ``decoder_input_ids``), Whisper (audio: the mel
``input_features`` its encoder expects, and decoder ids), Swin (images, with list-valued ``depths`` and
``num_heads``). The captured graph computes what the model computes on those inputs.
"""

from __future__ import annotations

import pytest
import torch

from explorer.errors import ModelLoadError
from explorer.sources import load_model
from explorer.sources.hf import load_hf_folder


def _t5():
    import transformers

    return transformers.T5Model(transformers.T5Config(vocab_size=200, d_model=48, d_kv=12, d_ff=80, num_layers=2,
                                                      num_decoder_layers=1, num_heads=4))


def _whisper():
    import transformers

    return transformers.WhisperModel(transformers.WhisperConfig(
        vocab_size=200, d_model=48, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=80, decoder_ffn_dim=80, num_mel_bins=20, max_source_positions=24,
        max_target_positions=16, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
        suppress_tokens=[], begin_suppress_tokens=[]))


def _swin():
    import transformers

    return transformers.SwinModel(transformers.SwinConfig(image_size=56, patch_size=4, num_channels=3, embed_dim=12,
                                                          depths=[1, 2], num_heads=[2, 3], window_size=7))


def _save(tmp_path, name, build):
    torch.manual_seed(0)
    folder = tmp_path / name
    build().save_pretrained(folder, safe_serialization=True)
    return folder


def _computes_the_model(model):
    with torch.no_grad():
        want = model.module(*model.example_inputs)
        got = model.gm(*model.example_inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert want.abs().max() > 0


def test_t5_gets_decoder_ids(tmp_path):
    model = load_hf_folder(_save(tmp_path, "t5", _t5), batch=2, seq_len=9)
    assert model.input_names == ["input_ids", "attention_mask", "decoder_input_ids"]
    assert [tuple(t.shape) for t in model.example_inputs] == [(2, 9)] * 3
    assert int(model.example_inputs[2].max()) < 200 and model.seq_len == 9
    _computes_the_model(model)


def test_whisper_gets_audio_features_not_token_ids(tmp_path):
    folder = _save(tmp_path, "whisper", _whisper)
    model = load_hf_folder(folder, batch=1, seq_len=5)
    assert model.input_names == ["input_features", "decoder_input_ids"]
    features, ids = model.example_inputs
    assert tuple(features.shape) == (1, 20, 48) and features.is_floating_point()   # mels x 2 * max_source_positions
    assert tuple(ids.shape) == (1, 5) and ids.dtype == torch.int64
    _computes_the_model(model)
    with pytest.raises(ModelLoadError) as info:
        load_hf_folder(folder, batch=1, seq_len=17)
    assert "exceeds this model's maximum of 16" in str(info.value) and "\n" not in str(info.value)


def test_swin_with_list_valued_config_loads_through_the_source(tmp_path):
    """Through ``load_model``: the folder's checks (a size estimate that reads ``num_heads: [2, 3]``), the
    isolated probe and the load."""
    model = load_model(str(_save(tmp_path, "swin", _swin)), batch=2)
    assert model.source == "hf" and model.input_names == ["pixel_values"]
    assert tuple(model.example_inputs[0].shape) == (2, 3, 56, 56) and model.seq_len is None
    _computes_the_model(model)


def _t5_encoder():
    import transformers

    return transformers.T5EncoderModel(transformers.T5Config(vocab_size=200, d_model=48, d_kv=12, d_ff=80,
                                                             num_layers=2, num_heads=4))


def test_a_t5_encoder_folder_builds_the_encoder_it_names(tmp_path):
    """``architectures: ["T5EncoderModel"]``: AutoModel would build the encoder-decoder ``T5Model`` (which then
    needs decoder inputs); the loader builds the class the folder names, from the installed transformers."""
    model = load_hf_folder(_save(tmp_path, "t5_encoder", _t5_encoder), batch=2, seq_len=9)
    assert type(model.module.model).__name__ == "T5EncoderModel"
    assert model.input_names == ["input_ids", "attention_mask"] and model.task == "features"
    _computes_the_model(model)


def test_only_a_bare_model_class_of_the_configs_type_is_taken_from_architectures():
    import transformers

    from explorer.sources.hf import named_base_model

    config = transformers.T5Config(vocab_size=200, d_model=48, d_kv=12, d_ff=80, num_layers=1, num_heads=4)
    for names, want in ((["T5EncoderModel"], transformers.T5EncoderModel), (["T5Model"], transformers.T5Model),
                        (["BertModel"], None),                  # another config type's class
                        (["T5ForConditionalGeneration"], None),  # a head: AutoModel builds the base model
                        (["T5PreTrainedModel"], None), (["__class__"], None), (["os.system"], None),
                        (["T5EncoderModel", "T5Model"], None), ("T5EncoderModel", None), (None, None)):
        config.architectures = names
        assert named_base_model(config) is want, names
