// AudioWorklet processor "pcm16-capture" (loaded by audio.js): the microphone's first channel
// -> mono pcm16 at `targetRate` (24000: the OpenAI Realtime input format), posted to the main
// thread as an ArrayBuffer every `chunkMs` ms. Resamples by linear interpolation when the
// context does not run at the target rate (Chromium honours AudioContext({sampleRate: 24000}),
// so usually it does not resample at all).
"use strict";

class Pcm16Capture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const {targetRate, chunkMs} = options.processorOptions;
    this.step = sampleRate / targetRate;  // input samples per output sample
    this.pos = 0;  // position of the next output sample, in input samples from this block's start
    this.last = 0;  // the previous block's last input sample (interpolation across blocks)
    this.size = Math.round(targetRate * chunkMs / 1000);
    this.out = new Int16Array(this.size);
    this.n = 0;
  }
  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    while (this.pos < input.length) {
      const i = Math.floor(this.pos), frac = this.pos - i;
      const a = i === 0 ? this.last : input[i - 1], b = input[i];
      const v = Math.max(-1, Math.min(1, a + (b - a) * frac));
      this.out[this.n++] = v < 0 ? v * 0x8000 : v * 0x7fff;
      if (this.n === this.size) {
        this.port.postMessage(this.out.buffer, [this.out.buffer]);  // transferred: out is now empty
        this.out = new Int16Array(this.size);
        this.n = 0;
      }
      this.pos += this.step;
    }
    this.pos -= input.length;
    this.last = input[input.length - 1];
    return true;
  }
}
registerProcessor("pcm16-capture", Pcm16Capture);
