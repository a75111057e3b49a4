"""Target/draft pairing: hidden size, vocabulary and tokenizer family, refused with both values (exit 2)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from app.cli import main
from containers import EngineContainer
from kvcache.models.draft_pairing import check_draft_pairing
from kvcache.errors import ConfigError
from kvcache.models.model_config import ModelConfig
from kvcache.models.presets import PRESET_DIR, load_model_config
from kvcache.inputs.server_args import ServerArgs
from kvcache.models.hf_config import model_config_from_hf

EAGLE3_HEAD = "EAGLE3-LLaMA3.1-Instruct-8B"  # hidden 4,096, vocab 128,256, draft_vocab_size 32,000

# Qwen2.5-0.5B-Instruct's public config.json (the fields the reader needs): one tokenizer with Qwen2.5-7B,
# whose checkpoint pads the vocabulary to 152,064 where the 0.5B pads it to 151,936.
QWEN25_05B: dict[str, Any] = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864,
    "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
    "max_position_embeddings": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "bos_token_id": 151643, "eos_token_id": 151645, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
}


def preset_with(name: str, **changes: Any) -> ModelConfig:
    hf = json.loads((PRESET_DIR / f"{name}.json").read_text())
    return model_config_from_hf({**hf, **changes}, name=f"{name}*")


def test_a_head_trained_for_the_target_pairs() -> None:
    check_draft_pairing(algorithm="EAGLE3", target=load_model_config("Llama-3.1-8B-Instruct"),
                        draft=load_model_config(EAGLE3_HEAD))
    # an EAGLE-3 head that reads a 2,048-wide target through target_hidden_size pairs with Llama-3.2-1B
    check_draft_pairing(algorithm="EAGLE3", target=load_model_config("Llama-3.2-1B-Instruct"),
                        draft=preset_with(EAGLE3_HEAD, target_hidden_size=2048))


def test_a_smaller_model_of_the_family_pairs_standalone() -> None:
    check_draft_pairing(algorithm="STANDALONE", target=load_model_config("Qwen2.5-7B-Instruct"),
                        draft=model_config_from_hf(QWEN25_05B, name="Qwen2.5-0.5B-Instruct"))
    check_draft_pairing(algorithm="STANDALONE", target=load_model_config("Llama-3.1-8B-Instruct"),
                        draft=load_model_config("Llama-3.2-1B-Instruct"))


@pytest.mark.parametrize(
    ("algorithm", "target", "draft", "message"),
    [
        # Llama-3.2-1B's hidden size is 2,048; the head reads 4,096
        ("EAGLE3", "Llama-3.2-1B-Instruct", EAGLE3_HEAD,
         "target_hidden_size) is 4096 in the draft but 2048 in the target"),
        # Qwen3-8B is 4,096 wide too, but its vocabulary is 151,936
        ("EAGLE3", "Qwen3-8B", EAGLE3_HEAD, "vocab_size (the shared embedding) is 128256 in the draft but 151936"),
        ("EAGLE", "Llama-3.1-8B-Instruct", EAGLE3_HEAD, "is an EAGLE3 head, not an EAGLE one; use --speculative-algorithm EAGLE3"),
        ("EAGLE3", "Llama-3.1-8B-Instruct", "Llama-3.2-1B-Instruct", "is a whole model (LlamaForCausalLM); use "
                                                                      "--speculative-algorithm STANDALONE"),
        # Llama-3 (bos 128,000) drafting for Qwen3 (bos 151,643)
        ("STANDALONE", "Qwen3-8B", "Llama-3.2-1B-Instruct", "bos_token_id (so the tokenizer differs) is 128000 in the "
                                                            "draft but 151643 in the target"),
        # Llama-3's 128,256 tokens drafting for Llama-2's 32,000 (both model_type llama)
        ("STANDALONE", "Llama-2-7b-hf", "Llama-3.2-1B-Instruct", "is 128000 in the draft but 1 in the target"),
    ],
)
def test_pairs_that_cannot_meet_are_refused_with_both_values(algorithm: str, target: str, draft: str,
                                                             message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_draft_pairing(algorithm=algorithm, target=load_model_config(target), draft=load_model_config(draft))
    assert message in str(info.value)


def test_vocabularies_further_apart_than_padding_are_refused_without_bos_ids() -> None:
    target = preset_with("Llama-2-7b-hf", bos_token_id=None)
    draft = preset_with("Llama-3.2-1B-Instruct", bos_token_id=None)
    with pytest.raises(ConfigError, match=r"vocab_size \(more apart than padding.*\) is 128256 in the draft but 32000"):
        check_draft_pairing(algorithm="STANDALONE", target=target, draft=draft)


def test_a_draft_vocabulary_larger_than_the_targets_is_refused() -> None:
    draft = preset_with(EAGLE3_HEAD, draft_vocab_size=200_000)
    with pytest.raises(ConfigError, match=r"draft_vocab_size .* is 200000 in the draft but vocab_size 128256"):
        check_draft_pairing(algorithm="EAGLE3", target=load_model_config("Llama-3.1-8B-Instruct"), draft=draft)


def test_the_cli_exits_2_naming_both_values(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "Qwen3-8B", "--speculative-algorithm", "EAGLE3", "--speculative-draft-model",
                 EAGLE3_HEAD, "--gpu", "H100-80GB"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "128256 in the draft but 151936 in the target" in err


def test_the_container_checks_the_pair_before_building() -> None:
    engine = EngineContainer(
        server_args=ServerArgs(speculative_algorithm="STANDALONE", speculative_draft_model="Llama-3.2-1B-Instruct",
                               device="meta"),
        model_config=load_model_config("Qwen3-8B"))
    with pytest.raises(ConfigError, match="bos_token_id"):
        engine.draft_model_config()
