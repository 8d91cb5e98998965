"""Vision-language models: the vision encoder, its projector and the language model planned together.

`spec` (what a model and its image data are), `reader` (Hugging Face configs with a `vision_config`), `params`
(parameter counts), `encoder_cost` (encoder time and memory per micro batch), `placement` (the encoder on pipeline
stage 0 of the language model's grid, or on its own grid), `emit_bridge` / `emit_mimo` (Megatron-Bridge recipe
overrides, Megatron-LM MIMO example arguments)."""
