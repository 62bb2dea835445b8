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

  // --8<-- [start:key]
  // One key per form instance, made when the form is (like HyphaBase's
  // useMemo(() => crypto.randomUUID(), [])), never per submit attempt.
  // Kept in sessionStorage with the form's values, so a reload and a
  // resubmit of the same booking reuse it.
  function loadFormState() {
    const saved = JSON.parse(sessionStorage.getItem(storageKey) || "null");
    if (saved && saved.key) return saved;
    return { key: crypto.randomUUID(), values: null };
  }

  let state = loadFormState();

  function saveFormState() {
    sessionStorage.setItem(storageKey, JSON.stringify(state));
  }

  function resetForm() {
    // Only after a booking succeeded: the next booking is a new operation.
    state = { key: crypto.randomUUID(), values: null };
    saveFormState();
    keyLabel.textContent = state.key;
  }
  // --8<-- [end:key]

  if (state.values) {
    for (const [name, value] of Object.entries(state.values)) form.elements[name].value = value;
  }
  saveFormState();
  keyLabel.textContent = state.key;

  function sleep(ms) {
    return new Promise((resolve) => setTimeout(resolve, ms));
  }

  // --8<-- [start:submit]
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
      const problem = response.headers.get("Content-Type") === "application/problem+json"
        ? await response.clone().json() : null;
      const inProgress = response.status === 409 && problem && problem.code === "idempotency_key_in_progress";
      const retryable = inProgress || response.status === 429 || response.status === 503 || response.status >= 500;
      if (!retryable || attempt >= 5) return response;
      const retryAfter = Number(response.headers.get("Retry-After"));
      await sleep(retryAfter > 0 ? retryAfter * 1000 : backoff(attempt));
    }
  }

  function backoff(attempt) {
    // Exponential backoff with full jitter, capped at 8 seconds.
    return Math.random() * Math.min(8000, 250 * 2 ** attempt);
  }
  // --8<-- [end:submit]

  async function submit(event) {
    event.preventDefault();
    const values = {
      location: form.elements.location.value.trim(),
      slot: form.elements.slot.value,
      customer: form.elements.customer.value,
    };
    state.values = values;
    saveFormState();
    const key = state.key;  // this submission's key, even if the form resets meanwhile
    const slot = values.slot ? values.slot + (values.slot.length === 16 ? ":00Z" : "Z") : "";
    const body = JSON.stringify({ slot: slot, customer: values.customer });
    result.dataset.outcome = "pending";
    result.textContent = "Booking…";
    let response;
    try {
      response = await sendBooking(key, values.location, body);
    } catch (error) {
      result.dataset.outcome = "error";
      result.textContent = "Network error; press Book again, it is safe (same key).";
      return;
    }
    const replayed = response.headers.get("Idempotency-Replayed") === "true";
    result.dataset.status = String(response.status);
    result.dataset.replayed = String(replayed);
    const data = await response.json().catch(() => ({}));
    if (response.status === 201) {
      result.dataset.outcome = replayed ? "replayed" : "created";
      result.dataset.bookingId = String(data.id);
      result.textContent = "Booking #" + data.id + " for " + data.customer + " at " + data.slot +
        (replayed ? " (Idempotency-Replayed: true, the stored answer; nothing was booked twice)"
                  : " (created)");
      if (key === state.key) resetForm();
    } else {
      result.dataset.outcome = "error";
      result.textContent = response.status + " " + (data.code || "") + ": " +
        (data.detail || JSON.stringify(data));
    }
    await refreshList(values.location);
  }

  async function refreshList(location) {
    const response = await fetch("/api/bookings/", {
      credentials: "same-origin",
      headers: { "X-Location-Id": location, Accept: "application/json" },
    });
    const rows = document.getElementById("bookings");
    rows.replaceChildren();
    if (!response.ok) return;
    for (const booking of await response.json()) {
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
