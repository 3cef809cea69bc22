"""config.json files written out from their published values (the Hub's config.json of each
model, the RoPE keys and the sizes they read), for the engines' tests. PHI3_128K's 48 long and
short factors are SYNTHETIC (a clearly labelled ramp, not Microsoft's list); every other value is
the published one. SMOLLM2_YARN is SmolLM2-135M with a YaRN factor 2 added (not published)."""

from __future__ import annotations

LLAMA31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32,
              "max_position_embeddings": 131072, "rope_theta": 500000.0, "vocab_size": 128256,
              "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
QWEN25_7B_YARN = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                  "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
                  "max_position_embeddings": 32768, "rope_theta": 1000000.0,
                  "rope_scaling": {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}}
DEEPSEEK_V3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
               "max_position_embeddings": 163840, "rope_theta": 10000, "qk_rope_head_dim": 64,
               "qk_nope_head_dim": 128, "v_head_dim": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
               "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "original_max_position_embeddings": 4096, "type": "yarn"}}
PHI3_SHORT = [1.0 + 0.01 * i for i in range(48)]  # SYNTHETIC
PHI3_LONG = [1.0 + 63.0 / 47 * i for i in range(48)]  # SYNTHETIC
PHI3_128K = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
             "num_attention_heads": 32, "num_key_value_heads": 32, "num_hidden_layers": 32,
             "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rope_theta": 10000.0,
             "rope_scaling": {"long_factor": PHI3_LONG, "short_factor": PHI3_SHORT, "type": "longrope"}}
GEMMA3_4B = {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 2560,
             "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "num_hidden_layers": 34,
             "max_position_embeddings": 131072, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0,
             "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024,
             "sliding_window_pattern": 6, "query_pre_attn_scalar": 256,
             "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)]}
GPT_OSS_20B = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
               "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64, "num_hidden_layers": 24,
               "max_position_embeddings": 131072, "rope_theta": 150000, "sliding_window": 128,
               "layer_types": ["sliding_attention", "full_attention"] * 12,
               "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False}}
MISTRAL_7B = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
              "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 32, "head_dim": 128,
              "max_position_embeddings": 32768, "rope_theta": 1000000.0}
SMOLLM3_3B = {"architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", "hidden_size": 2048,
              "num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 36,
              "max_position_embeddings": 65536, "rope_theta": 5000000.0, "no_rope_layer_interval": 4,
              "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)]}
SMOLLM2_135M = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30, "head_dim": 64,
                "max_position_embeddings": 8192, "rope_theta": 100000, "rope_scaling": None}
SMOLLM2_YARN = {**SMOLLM2_135M, "max_position_embeddings": 16384,
                "rope_scaling": {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192}}
QWEN25_7B_1M = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
                "num_attention_heads": 28, "num_key_value_heads": 4, "num_hidden_layers": 28,
                "max_position_embeddings": 1010000, "rope_theta": 10000000.0,
                "dual_chunk_attention_config": {"chunk_size": 262144, "local_size": 8192,
                                                "original_max_position_embeddings": 262144}}
LLAMA4_SCOUT = {"architectures": ["Llama4ForCausalLM"], "model_type": "llama4_text", "hidden_size": 5120,
                "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 48,
                "max_position_embeddings": 10485760, "rope_theta": 500000.0,
                "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(48)],
                "rope_scaling": {"factor": 16.0, "low_freq_factor": 1.0, "high_freq_factor": 1.0,
                                 "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
#: the ten families ``posenc rope`` is shown on (name -> published config)
FAMILIES = {"Llama 3.1": LLAMA31_8B, "Qwen2.5 YaRN": QWEN25_7B_YARN, "Qwen2.5-1M DCA": QWEN25_7B_1M,
            "DeepSeek-V3": DEEPSEEK_V3, "Phi-3 LongRoPE": PHI3_128K, "Gemma 3": GEMMA3_4B, "gpt-oss": GPT_OSS_20B,
            "Mistral": MISTRAL_7B, "SmolLM3": SMOLLM3_3B, "Llama 4 Scout": LLAMA4_SCOUT}
