"""One file per rule; `audit.registry.load_rules()` imports every module here."""
