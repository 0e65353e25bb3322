// Browser audio for the voice pages: microphone capture to pcm16 24 kHz (an AudioWorklet) and a
// playback queue with a small jitter buffer that can be cleared at once (barge-in). ES module.
"use strict";

export const RATE = 24000;  // pcm16 mono 24 kHz both ways (the OpenAI Realtime default format)
const CHUNK_MS = 40;  // microphone audio per input_audio_buffer.append
// Playback starts this long after the first chunk of a burst arrives, so chunks that arrive a
// little late still play back to back. Received audio is never dropped (it is the answer); the
// queue empties only by playing or by clear().
export const JITTER_LEAD_MS = 80;

/** An AudioContext at 24 kHz (Chromium resamples the microphone and the output for us). */
export function audioContext() {
  return new AudioContext({sampleRate: RATE, latencyHint: "interactive"});
}

/** Capture the microphone into `onChunk(ArrayBuffer of pcm16 24 kHz)`; returns a stop function.
 * `processing` false turns off the browser's echo cancellation, noise suppression and gain. */
export async function startMicrophone(ctx, onChunk, processing = true) {
  const stream = await navigator.mediaDevices.getUserMedia({audio: {channelCount: 1,
    echoCancellation: processing, noiseSuppression: processing, autoGainControl: processing}});
  const worklet = new URL("mic-worklet.js" + new URL(import.meta.url).search, import.meta.url);
  await ctx.audioWorklet.addModule(worklet);
  const source = ctx.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(ctx, "pcm16-capture", {numberOfOutputs: 0,
    processorOptions: {targetRate: RATE, chunkMs: CHUNK_MS}});
  node.port.onmessage = (m) => onChunk(m.data);
  source.connect(node);
  return () => { source.disconnect(); node.port.onmessage = null; stream.getTracks().forEach((t) => t.stop()); };
}

/** base64 of an ArrayBuffer / from base64 to an ArrayBuffer. */
export function toBase64(buffer) {
  const bytes = new Uint8Array(buffer);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}
export function fromBase64(text) {
  const s = atob(text), bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return bytes.buffer;
}

/** Plays pcm16 chunks of assistant items in arrival order; knows how much of each was heard. */
export class Player {
  constructor(ctx) {
    this.ctx = ctx;
    this.next = 0;  // context time at which the next chunk starts
    this.segments = [];  // {source, itemId, start, duration} still scheduled or playing
    this.receivedMs = new Map();  // itemId -> ms of audio received
    this.heardMs = new Map();  // itemId -> ms played out of segments that finished
  }
  /** Queue a chunk of `itemId`; returns the context time at which it starts playing. */
  push(itemId, pcm16) {
    const samples = new Int16Array(pcm16), buffer = this.ctx.createBuffer(1, samples.length, RATE);
    const channel = buffer.getChannelData(0);
    for (let i = 0; i < samples.length; i++) channel[i] = samples[i] / 0x8000;
    const now = this.ctx.currentTime, start = Math.max(this.next, now + JITTER_LEAD_MS / 1000);
    const source = this.ctx.createBufferSource();
    source.buffer = buffer;
    source.connect(this.ctx.destination);
    source.start(start);
    const segment = {source, itemId, start, duration: buffer.duration};
    source.onended = () => this.retire(segment, buffer.duration);
    this.segments.push(segment);
    this.next = start + buffer.duration;
    this.receivedMs.set(itemId, (this.receivedMs.get(itemId) || 0) + buffer.duration * 1000);
    return start;
  }
  retire(segment, playedS) {
    const i = this.segments.indexOf(segment);
    if (i < 0) return;
    this.segments.splice(i, 1);
    this.heardMs.set(segment.itemId, (this.heardMs.get(segment.itemId) || 0) + playedS * 1000);
  }
  /** ms of audio queued and not yet played. */
  queuedMs() { return Math.max(0, this.next - this.ctx.currentTime) * 1000; }
  /** ms of `itemId` played so far. */
  playedMs(itemId) {
    const now = this.ctx.currentTime;
    let ms = this.heardMs.get(itemId) || 0;
    for (const s of this.segments) {
      if (s.itemId === itemId) ms += Math.min(s.duration, Math.max(0, now - s.start)) * 1000;
    }
    return ms;
  }
  /** Forget a finished item's counters (a long duplex session has many). */
  forget(itemId) { this.receivedMs.delete(itemId); this.heardMs.delete(itemId); }
  /** Stop at once and drop the queue. Returns the items that were cut: [{itemId, playedMs,
   * receivedMs}] (what was heard is what conversation.item.truncate should keep). */
  clear() {
    const cut = [...new Set(this.segments.map((s) => s.itemId))].map((itemId) =>
      ({itemId, playedMs: this.playedMs(itemId), receivedMs: this.receivedMs.get(itemId) || 0}));
    const now = this.ctx.currentTime;
    for (const s of [...this.segments]) {
      s.source.onended = null;
      s.source.stop();
      this.retire(s, Math.min(s.duration, Math.max(0, now - s.start)));
    }
    this.next = 0;
    return cut;
  }
}
