"""Robot policies: the interface the runtime drives, the embedded pi0-tiny default, presets, RTC."""
