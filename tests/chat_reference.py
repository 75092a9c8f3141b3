"""What the chat checks share: transformers' tokenizer for a tokenizer.json and the settings of a
tokenizer_config.json, the reference the trainer's chat templates are compared with."""


def hf_tokenizer(vocab_json, config):
    """transformers' fast tokenizer over `vocab_json` with `config`'s bos/eos tokens and chat
    template (transformers is imported by the caller, which skips without it)."""
    import transformers

    t = transformers.PreTrainedTokenizerFast(tokenizer_file=vocab_json,
                                             bos_token=config.get("bos_token"),
                                             eos_token=config.get("eos_token"))
    t.chat_template = config.get("chat_template")
    return t
