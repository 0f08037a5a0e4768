// Runs `fn` once input has paused for `ms`; `flush()` runs a pending call now and waits for it.
export function debounce(fn, ms) {
  let timer = null;
  let pending = null;
  const run = () => {
    const args = pending;
    timer = null;
    pending = null;
    return fn(...args);
  };
  const debounced = (...args) => {
    clearTimeout(timer);
    pending = args;
    timer = setTimeout(run, ms);
  };
  debounced.flush = async () => {
    if (timer === null) return;
    clearTimeout(timer);
    await run();
  };
  return debounced;
}
