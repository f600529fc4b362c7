/**
 * How every view of the extension writes time: one duration format and one time format, the
 * same as the Python side's (`gpushare jobs`, %gpushare, the dashboard). Pure, no DOM: unit
 * tested under plain Node.
 *
 * - durations: "45s", "1m 10s", "2h 05m", "3d 4h";
 * - times: relative for recent events ("just now", "2 min ago"), otherwise the clock time in
 *   the user's locale (hour and minute; with the date when it is not today).
 */

/** Which locale and time zone to write clock times in: the browser's unless given (tests). */
export interface ClockOptions {
  locale?: string;
  timeZone?: string;
}

/** A duration in seconds: "45s", "1m 10s", "2h 05m", "3d 4h" (never negative). */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  if (s < 60) {
    return `${s}s`;
  }
  const pad = (n: number): string => String(n).padStart(2, '0');
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  }
  if (s < 86400) {
    return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  }
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

function dayKey(t: number, options: ClockOptions): string {
  return new Intl.DateTimeFormat('en-CA', { timeZone: options.timeZone, dateStyle: 'short' }).format(
    new Date(t * 1000)
  );
}

/**
 * A clock time (seconds since the epoch) as the user's locale writes hour and minute ("14:05",
 * "2:05 PM"); on another day than `now`, with the day ("12 Mar, 14:05").
 */
export function clockTime(t: number, now: number = Date.now() / 1000, options: ClockOptions = {}): string {
  const sameDay = dayKey(t, options) === dayKey(now, options);
  const format = new Intl.DateTimeFormat(options.locale, {
    hour: 'numeric',
    minute: '2-digit',
    timeZone: options.timeZone,
    ...(sameDay ? {} : { month: 'short', day: 'numeric' })
  });
  return format.format(new Date(t * 1000));
}

/**
 * When something happened: "just now" within the minute, "2 min ago" within the hour, else
 * the clock time. A time ahead of `now` (a clock a little off) reads as "just now".
 */
export function ago(t: number, now: number = Date.now() / 1000, options: ClockOptions = {}): string {
  const seconds = now - t;
  if (seconds < 60) {
    return 'just now';
  }
  if (seconds < 3600) {
    return `${Math.floor(seconds / 60)} min ago`;
  }
  return clockTime(t, now, options);
}
