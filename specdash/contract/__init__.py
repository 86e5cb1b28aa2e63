"""The contract every part shares: errors, the cache folder, the limits, the events and the command vocabulary."""
