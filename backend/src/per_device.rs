//! [`PerDevice`]: settings chosen in code for one device, in place of the environment's.

use std::sync::Mutex;

use crate::TrainiumDevice;

/// A value per device, set in code (`set_segment_cap`, `set_operator_rules`,
/// `set_host_fallback`); a device without one falls back to what its caller reads otherwise.
pub(crate) struct PerDevice<T> {
    chosen: Mutex<Vec<(TrainiumDevice, T)>>,
}

impl<T: Copy> PerDevice<T> {
    /// No device has a value yet.
    pub const fn new() -> Self {
        Self {
            chosen: Mutex::new(Vec::new()),
        }
    }

    /// Gives `device` the value `value`, replacing any earlier one.
    pub fn set(&self, device: &TrainiumDevice, value: T) {
        let mut chosen = self.chosen.lock().unwrap_or_else(|p| p.into_inner());
        chosen.retain(|(other, _)| other != device);
        chosen.push((*device, value));
    }

    /// The value set for `device`, if any.
    pub fn get(&self, device: &TrainiumDevice) -> Option<T> {
        self.chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|(other, _)| other == device)
            .map(|&(_, value)| value)
    }
}
