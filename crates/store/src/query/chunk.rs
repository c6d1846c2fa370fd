//! [`EventChunk`]: the events one query step answers, their JSON end to
//! end in one buffer.
//!
//! A step hands its events from a query worker to a session's task on
//! another thread. As one `String` each, every event was an allocation on
//! the worker and a free on the runtime thread, the allocator's slow path
//! (a free from another thread goes back to the arena under its lock). One
//! buffer per step is one allocation each way, and the session frames the
//! events straight from it.

/// Where a query step puts the events it answers, in order: an
/// [`EventChunk`] (the read path), or a `Vec<String>` (a whole query, or a
/// test).
pub trait EventSink {
    fn push_event(&mut self, raw: &str);
}

impl EventSink for Vec<String> {
    fn push_event(&mut self, raw: &str) {
        self.push(raw.to_owned());
    }
}

impl EventSink for EventChunk {
    fn push_event(&mut self, raw: &str) {
        self.push(raw);
    }
}

/// The raw JSON of a step's events, in answer order.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct EventChunk {
    text: String,
    /// Where each event ends in `text`.
    ends: Vec<u32>,
}

impl EventChunk {
    pub fn new() -> EventChunk {
        EventChunk::default()
    }

    /// Appends one event's JSON.
    pub fn push(&mut self, raw: &str) {
        self.text.push_str(raw);
        // An event is at most `limits.max_message_bytes` and a step at most
        // `engine.step_bytes` plus one event: far below 4 GiB.
        self.ends
            .push(u32::try_from(self.text.len()).unwrap_or(u32::MAX));
    }

    /// Events in the chunk.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes the buffer holds without growing.
    pub fn capacity(&self) -> usize {
        self.text.capacity()
    }

    /// Empties the chunk, keeping its buffers.
    pub fn clear(&mut self) {
        self.text.clear();
        self.ends.clear();
    }

    /// Bytes of JSON in the chunk.
    pub fn bytes(&self) -> usize {
        self.text.len()
    }

    /// The events' JSON, in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let end = end as usize;
            let raw = &self.text[start..end];
            start = end;
            raw
        })
    }
}

#[cfg(test)]
mod tests {
    use super::EventChunk;

    #[test]
    fn events_come_back_whole_and_in_order() {
        let mut c = EventChunk::new();
        assert!(c.is_empty());
        assert_eq!(c.iter().count(), 0);
        c.push(r#"{"id":"a"}"#);
        c.push("");
        c.push(r#"{"id":"é"}"#);
        assert_eq!(c.len(), 3);
        assert_eq!(c.bytes(), 10 + 11);
        let got: Vec<&str> = c.iter().collect();
        assert_eq!(got, [r#"{"id":"a"}"#, "", r#"{"id":"é"}"#]);
        c.clear();
        assert!(c.is_empty() && c.bytes() == 0);
    }
}
