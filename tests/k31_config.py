"""The full K3.1 Pro config.json (MODEL_SPEC §2.3) as a dict: the proxy preset's widths with
93 layers (MLA at every fourth 1-based layer and the last) and 896 experts."""

from atomk31.checkpoint.presets import preset_config


def k31_pro_config() -> dict:
    config = preset_config("proxy")
    text = config["text_config"]
    mla = [i for i in range(1, 94) if i % 4 == 0 or i == 93]
    text.update(num_hidden_layers=93, num_experts=896)
    text["linear_attn_config"].update(full_attn_layers=mla,
                                      kda_layers=[i for i in range(1, 94) if i not in mla])
    return config
