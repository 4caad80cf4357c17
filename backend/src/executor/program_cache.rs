//! The compiled programs an executor keeps, keyed by the structural key of their module.

use std::collections::HashMap;
use std::sync::Arc;

use crate::lower::{LoweredProgram, StructuralKey};

/// How much a program cache may hold before it evicts the least recently used program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CacheLimits {
    /// Programs.
    pub programs: usize,
    /// HLO instructions of all programs together (compiled code grows with them).
    pub instructions: usize,
    /// The share of the kernel's limit on memory mappings the process may hold once a program
    /// is kept (compiled code is mapped a few regions per kernel); `None`: not bounded so.
    pub mapped_share: Option<f64>,
}

struct Entry<P> {
    /// The module the program was compiled from, compared on every hit so that a hash collision
    /// can never run the wrong program (a repeated segment shares it: nothing to compare).
    module: Arc<Vec<u8>>,
    program: Arc<P>,
    instructions: usize,
    last_use: u64,
}

/// Compiled programs, least recently used evicted beyond the [`CacheLimits`].
pub(crate) struct ProgramCache<P> {
    limits: CacheLimits,
    entries: HashMap<StructuralKey, Entry<P>>,
    instructions: usize,
    clock: u64,
}

fn instruction_count(program: &LoweredProgram) -> usize {
    program
        .module
        .computations
        .iter()
        .map(|computation| computation.instructions.len())
        .sum()
}

impl<P> ProgramCache<P> {
    /// An empty cache.
    pub fn new(limits: CacheLimits) -> Self {
        Self {
            limits,
            entries: HashMap::new(),
            instructions: 0,
            clock: 0,
        }
    }

    /// The program compiled from `lowered`'s module, if kept.
    pub fn get(&mut self, lowered: &LoweredProgram) -> Option<Arc<P>> {
        self.clock += 1;
        let entry = self.entries.get_mut(&lowered.key)?;
        if !Arc::ptr_eq(&entry.module, &lowered.bytes) && *entry.module != *lowered.bytes {
            return None;
        }
        entry.last_use = self.clock;
        Some(entry.program.clone())
    }

    /// Whether the process holds more of its memory mappings than the limits allow.
    fn mappings_exhausted(&self) -> bool {
        self.limits.mapped_share.is_some_and(|allowed| {
            super::mappings::mapping_share().is_some_and(|share| share > allowed)
        })
    }

    /// Keeps `program`, compiled from `lowered`'s module, evicting as the limits require.
    pub fn insert(&mut self, lowered: &LoweredProgram, program: P) -> Arc<P> {
        let instructions = instruction_count(lowered);
        if let Some(replaced) = self.entries.remove(&lowered.key) {
            self.instructions -= replaced.instructions;
        }
        while !self.entries.is_empty()
            && (self.entries.len() >= self.limits.programs
                || self.instructions + instructions > self.limits.instructions
                || self.mappings_exhausted())
        {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.last_use)
                .map(|(key, _)| *key)
                .expect("the cache is not empty");
            if let Some(evicted) = self.entries.remove(&oldest) {
                self.instructions -= evicted.instructions;
            }
        }
        let program = Arc::new(program);
        self.instructions += instructions;
        log::debug!(
            "keeping a program of {instructions} instructions: {} programs of {} instructions \
             kept",
            self.entries.len() + 1,
            self.instructions
        );
        self.entries.insert(
            lowered.key,
            Entry {
                module: lowered.bytes.clone(),
                program: program.clone(),
                instructions,
                last_use: self.clock,
            },
        );
        program
    }
}
