"""What a run leaves behind: recordings, run files read back, two runs compared, exports."""
