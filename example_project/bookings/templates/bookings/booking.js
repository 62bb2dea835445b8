"use strict";
(function () {
  const form = document.getElementById("booking-form");
  const result = document.getElementById("result");
  const keyLabel = document.getElementById("idempotency-key");
  const storageKey = "idempotency:" + form.dataset.formId;

  function readCookie(name) {
    const prefix = name + "=";
    for (const part of document.cookie.split(";")) {
      const cookie = part.trim();
      if (cookie.startsWith(prefix)) return decodeURIComponent(cookie.slice(prefix.length));
    }
    return "";
  }

  function formValues() {
    return {
      location: form.elements.location.value.trim(),
      slot: form.elements.slot.value,
      customer: form.elements.customer.value,
    };
  }

  // One operation = the form's contents and one key. The key is made before the
  // first attempt and reused by every resubmit of the same contents (a double-click,
  // a retry, a reload then Book), until the operation is answered. Other contents
  // are another operation with another key, so editing the form after a reload can
  // never send an old key with a new body. Kept in sessionStorage: survives a reload.
  const saved = JSON.parse(sessionStorage.getItem(storageKey) || "null");
  const state = saved && saved.keys ? saved : { keys: {}, values: null };

  function contentsOf(values) {
    return JSON.stringify([values.location, values.slot, values.customer]);
  }

  function keyFor(values) {
    const contents = contentsOf(values);
    if (!state.keys[contents]) state.keys[contents] = crypto.randomUUID();
    state.values = values;  // to fill the form in again after a reload
    saveState();
    return state.keys[contents];
  }

  function finishOperation(values, key) {
    // Answered for good: the same contents again would be a new booking.
    const contents = contentsOf(values);
    if (state.keys[contents] === key) delete state.keys[contents];
    saveState();
  }

  function saveState() {
    sessionStorage.setItem(storageKey, JSON.stringify(state));
    showKey();
  }

  function showKey() {
    const key = state.keys[contentsOf(formValues())];
    keyLabel.textContent = key || "a new one, made when you press Book";
    keyLabel.dataset.key = key || "";
  }

  if (state.values) {
    for (const [name, value] of Object.entries(state.values)) form.elements[name].value = value;
  }
  showKey();
  form.addEventListener("input", showKey);

  function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }

  async function sendBooking(key, location, body) {
    // Retries keep the method, path, body bytes and key; only the wait changes.
    for (let attempt = 1; ; attempt++) {
      let response;
      try {
        response = await fetch("/api/bookings/", {
          method: "POST",
          credentials: "same-origin",
          headers: {
            "Content-Type": "application/json",
            "X-CSRFToken": readCookie("csrftoken"),
            "X-Location-Id": location,
            "Idempotency-Key": key,
          },
          body: body,
        });
      } catch (networkError) {
        if (attempt >= 5) throw networkError;
        await sleep(backoff(attempt));
        continue;
      }
      const problem = await problemCode(response);
      const retryable = problem === "idempotency_key_in_progress" ||
        response.status === 429 || response.status >= 500;
      if (!retryable || attempt >= 5) return response;
      const retryAfter = Number(response.headers.get("Retry-After"));
      await sleep(retryAfter > 0 ? retryAfter * 1000 : backoff(attempt));
    }
  }

  async function problemCode(response) {
    if (response.headers.get("Content-Type") !== "application/problem+json") return "";
    const problem = await response.clone().json().catch(() => ({}));
    return problem.code || "";
  }

  function backoff(attempt) {
    // Exponential backoff with full jitter, capped at 8 seconds.
    return Math.random() * Math.min(8000, 250 * 2 ** attempt);
  }

  function describe(booking) {
    return "booking #" + booking.id + " for " + (booking.customer || "(no name)") + " at " +
      booking.slot + " in " + booking.location;
  }

  async function submit(event) {
    event.preventDefault();
    const values = formValues();
    const key = keyFor(values);  // this submission's key, whatever happens to the form meanwhile
    const slot = values.slot ? values.slot + (values.slot.length === 16 ? ":00Z" : "Z") : "";
    const body = JSON.stringify({ slot: slot, customer: values.customer });
    result.dataset.outcome = "pending";
    result.dataset.key = key;
    result.textContent = "Booking…";
    let response;
    try {
      response = await sendBooking(key, values.location, body);
    } catch (error) {
      result.dataset.outcome = "error";
      result.textContent = "Network error; press Book again, it is safe (same contents, same key).";
      return;
    }
    const replayed = response.headers.get("Idempotency-Replayed") === "true";
    const problem = await problemCode(response);
    result.dataset.status = String(response.status);
    result.dataset.replayed = String(replayed);
    const data = await response.json().catch(() => ({}));
    if (response.status === 201) {
      finishOperation(values, key);
      result.dataset.outcome = replayed ? "replayed" : "created";
      result.dataset.bookingId = String(data.id);
      result.textContent = "Booked: " + describe(data) +
        (replayed ? " (Idempotency-Replayed: true, the stored answer; nothing was booked twice)."
                  : " (created).");
    } else if (problem === "idempotency_key_reused") {
      // The key went with other contents before (an older page, another tab): that
      // earlier submission went through. Show it, and make a new key for these contents.
      finishOperation(values, key);
      const earlier = await latestBooking(values.location);
      result.dataset.outcome = "reused";
      result.dataset.bookingId = earlier ? String(earlier.id) : "";
      result.textContent = "An earlier submission with this key went through" +
        (earlier ? ": " + describe(earlier) + "." : ".") +
        " Nothing new was booked. Press Book again to make another booking; it gets a new key.";
    } else {
      result.dataset.outcome = "error";
      result.textContent = response.status + " " + (data.code || "") + ": " +
        (data.detail || JSON.stringify(data));
    }
    await refreshList(values.location);
  }

  async function listBookings(location) {
    const response = await fetch("/api/bookings/", {
      credentials: "same-origin",
      headers: { "X-Location-Id": location, Accept: "application/json" },
    });
    return response.ok ? await response.json() : [];
  }

  async function latestBooking(location) {
    const bookings = await listBookings(location);
    return bookings.reduce((latest, b) => (!latest || b.id > latest.id ? b : latest), null);
  }

  async function refreshList(location) {
    const rows = document.getElementById("bookings");
    const bookings = await listBookings(location);
    rows.replaceChildren();
    for (const booking of bookings) {
      const row = document.createElement("tr");
      for (const value of [booking.id, booking.slot, booking.customer, booking.location]) {
        const cell = document.createElement("td");
        cell.textContent = value;
        row.appendChild(cell);
      }
      rows.appendChild(row);
    }
  }

  form.addEventListener("submit", submit);
  refreshList(form.elements.location.value.trim());
})();
