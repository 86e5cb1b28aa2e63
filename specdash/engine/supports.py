"""The commands the engine applies, by registry name (commands_registry): what its
settings events list in `supports`. A module of its own, without llama.cpp, so the
embedded source can say what an engine will take while its models are still loading
(sources/embedded.py derives its `supports` from these). tests/test_capabilities.py
holds them to the commands `Engine._apply` handles."""

# Taken by every engine.
ALWAYS = ("k", "temp", "cut", "pause", "stop", "forget")
# Each taken when the engine was built with what it needs (Engine.settings_event says
# which, and why not in `unavailable`): a drafter factory, an adaptive-K controller,
# a MoE target it can reload.
WHEN_ABLE = ("draft", "adaptive", "experts")
