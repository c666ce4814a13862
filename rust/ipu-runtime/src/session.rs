//! Loading a package onto a device and driving its streaming calls
//! (docs/host-protocol.md).

use std::collections::BTreeMap;
use std::sync::Arc;

use ipu_graph::{Graph, TensorType};
use ipu_package::{Package, Placement, StreamTensor, EXIT_COMMAND};
use ipu_reference::Tensor;

use crate::device::{Device, DeviceStop};
use crate::lock::DeviceLock;
use crate::members::{self, CallCheckpoints, CHECKPOINT_FLAG};
use crate::progress::{CallStart, ProgressHook, Watch};
use crate::RuntimeError;

/// Cycle figures of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallCycles {
    /// The call's name.
    pub call: String,
    /// Whether this was a checkpoint run (extra host syncs).
    pub checkpoint: bool,
    /// Device cycles from the resume to the call's final host sync,
    /// excluding the host transfer of the inputs.
    pub device_cycles: u64,
    /// Host link cycles for the inputs and the command word.
    pub host_in_cycles: u64,
    /// Host link cycles for the outputs (charged when the device next resumes).
    pub host_out_cycles: u64,
    /// Host link cycles of the inputs written at the call's host stops,
    /// which `device_cycles` includes: the device waits for them.
    pub host_stream_cycles: u64,
    /// Index of the call's first BSP step in [`Device::steps`].
    pub first_step: usize,
    /// One past the call's last BSP step (the final host sync).
    pub end_step: usize,
}

impl CallCycles {
    /// BSP steps the call took, including its final host sync.
    pub fn steps(&self) -> usize {
        self.end_step - self.first_step
    }
}

/// The result of a call.
#[derive(Clone, Debug)]
pub struct CallOutput {
    /// Outputs by name.
    pub outputs: BTreeMap<String, Tensor>,
    /// Values read at checkpoint stops, by graph value name (checkpoint runs only).
    pub checkpoints: BTreeMap<String, Tensor>,
    /// Cycle figures.
    pub cycles: CallCycles,
}

/// A package loaded on a device, idle at a host sync between calls.
pub struct Session {
    device: Box<dyn Device>,
    package: Package,
    lock: Option<DeviceLock>,
    finished: bool,
    calls: Vec<CallCycles>,
    /// Host bytes moved while stopped at each host-sync step (by step index).
    host_bytes: BTreeMap<usize, u64>,
    /// Told when each call starts and ends, with the call's estimate.
    progress: Option<(ProgressHook, BTreeMap<String, u64>)>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("device", &self.device.describe())
            .field("model", &self.package.info.model)
            .field("calls", &self.calls.len())
            .finish()
    }
}

fn type_text(t: &StreamTensor) -> String {
    TensorType::new(t.dtype, t.shape.clone()).to_string()
}

impl Session {
    /// Loads `package` onto `device`: checks it fits, replays the
    /// configuration, writes every tile image, sets entry points and runs to
    /// the first host sync. `lock` (ownership of the device) is held until
    /// the session is dropped.
    pub fn load(
        mut device: Box<dyn Device>,
        package: Package,
        lock: Option<DeviceLock>,
    ) -> Result<Session, RuntimeError> {
        let info = &package.info;
        tracing::info!(device = %device.describe(), "IPU device attached");
        if info.tile_count > device.tile_count() {
            return Err(RuntimeError::TileCount {
                package: info.tile_count,
                device: device.tile_count(),
                device_name: device.describe(),
            });
        }
        tracing::info!(
            register_writes = info.config_writes.len(),
            "replaying device configuration"
        );
        device.configure(&info.config_writes)?;
        let symbols = members::symbols(&package)?;
        let loaded: u64 = package
            .tiles
            .values()
            .flat_map(|i| &i.segments)
            .map(|s| s.bytes.len() as u64)
            .sum();
        tracing::info!(
            tile_count = info.tile_count,
            images = package.tiles.len(),
            bytes = loaded,
            "loading application"
        );
        for (&tile, image) in &package.tiles {
            for seg in &image.segments {
                device.write(tile, seg.address, &seg.bytes)?;
            }
            device.set_entry(tile, image.entry_pc)?;
            if let Some(map) = symbols.get(&tile) {
                device.set_symbols(tile, Arc::new(map.clone()))?;
            }
        }
        tracing::info!(
            command_address = format_args!("{:#x}", info.host.command_address),
            "starting host exchange session"
        );
        match device.run()? {
            DeviceStop::HostSync => {}
            DeviceStop::Exited => {
                return Err(RuntimeError::Protocol(
                    "the program exited before its first hsync (docs/host-protocol.md: the first \
                     hsync after load is the idle state)"
                        .to_string(),
                ))
            }
        }
        tracing::info!(
            startup_cycles = device.cycles(),
            "host exchange session started"
        );
        Ok(Session {
            device,
            package,
            lock,
            finished: false,
            calls: Vec::new(),
            host_bytes: BTreeMap::new(),
            progress: None,
        })
    }

    /// The package.
    pub fn package(&self) -> &Package {
        &self.package
    }

    /// The device.
    pub fn device(&self) -> &dyn Device {
        self.device.as_ref()
    }

    /// The ownership lock, if the session holds one.
    pub fn lock(&self) -> Option<&DeviceLock> {
        self.lock.as_ref()
    }

    /// Every call made so far.
    pub fn calls(&self) -> &[CallCycles] {
        &self.calls
    }

    /// Host bytes moved while stopped at each host-sync step, by step index.
    pub fn host_bytes(&self) -> &BTreeMap<usize, u64> {
        &self.host_bytes
    }

    /// Tells `hook` (or nobody) when each later call starts and ends, with
    /// the call's estimated cycles from `schedule.json` where every step of
    /// the call has one.
    pub fn set_progress(&mut self, hook: Option<ProgressHook>) {
        self.progress = hook.map(|h| {
            // Only the bars read these: a `schedule.json` that does not
            // parse leaves them without an estimate (the profile, which
            // needs it, reports the error).
            let estimates = members::schedule(&self.package)
                .ok()
                .flatten()
                .map(|s| {
                    s.calls
                        .iter()
                        .filter_map(|c| Some((c.call.clone(), c.estimated_cycles()?)))
                        .collect()
                })
                .unwrap_or_default();
            (h, estimates)
        });
    }

    /// Runs call `name` with `inputs` (exactly the call's inputs, by name).
    pub fn call(
        &mut self,
        name: &str,
        inputs: &BTreeMap<String, Tensor>,
    ) -> Result<CallOutput, RuntimeError> {
        self.call_inner(name, inputs, None)
    }

    /// Runs call `name` as a checkpoint run and also reads every value of
    /// `checkpoints` at its stop (docs/runtime.md).
    pub fn call_with_checkpoints(
        &mut self,
        name: &str,
        inputs: &BTreeMap<String, Tensor>,
        checkpoints: &CallCheckpoints,
        graph: &Graph,
    ) -> Result<CallOutput, RuntimeError> {
        self.call_inner(name, inputs, Some((checkpoints, graph)))
    }

    fn charge(&mut self, bytes: u64) {
        let at = self.device.steps().len().saturating_sub(1);
        *self.host_bytes.entry(at).or_insert(0) += bytes;
    }

    /// Reads a value from its placements; `transposed` placements index
    /// the value transposed, which the host undoes.
    fn read_value(
        &mut self,
        (placements, transposed): (&[Placement], bool),
        ty: &TensorType,
        what: &str,
    ) -> Result<(Tensor, u64), RuntimeError> {
        let mut buffer = vec![0u8; ty.bytes() as usize];
        let mut moved = 0u64;
        for p in placements {
            let bytes = self.device.read(p.tile, p.address, p.bytes)?;
            buffer[p.offset as usize..p.offset as usize + p.bytes as usize].copy_from_slice(&bytes);
            moved += p.bytes as u64;
        }
        if transposed {
            buffer = ipu_package::natural_order(&buffer, ty.shape.dims(), ty.dtype.size_bytes());
        }
        let t = Tensor::from_bytes(ty, &buffer)
            .map_err(|e| RuntimeError::Protocol(format!("{what}: {e}")))?;
        Ok((t, moved))
    }

    /// Writes the inputs of `call` that the host writes at host stop
    /// `stop` (0: before the call) and returns their bytes.
    fn write_inputs(
        &mut self,
        call: &ipu_package::StreamingCall,
        inputs: &BTreeMap<String, Tensor>,
        stop: u32,
    ) -> Result<u64, RuntimeError> {
        let mut moved = 0u64;
        for t in call.inputs.iter().filter(|t| t.stop == stop) {
            let mut data = inputs[&t.name].to_bytes();
            // The host rearranges a tensor the device holds transposed.
            if t.transposed {
                data = ipu_package::transposed_order(&data, &t.shape, t.dtype.size_bytes());
            }
            for p in &t.placements {
                let range = p.offset as usize..p.offset as usize + p.bytes as usize;
                self.device.write(p.tile, p.address, &data[range])?;
                moved += p.bytes as u64;
            }
        }
        Ok(moved)
    }

    fn call_inner(
        &mut self,
        name: &str,
        inputs: &BTreeMap<String, Tensor>,
        checkpoints: Option<(&CallCheckpoints, &Graph)>,
    ) -> Result<CallOutput, RuntimeError> {
        if self.finished {
            return Err(RuntimeError::Protocol(
                "the session has ended (the device exited)".to_string(),
            ));
        }
        let index = self
            .package
            .info
            .calls
            .iter()
            .position(|c| c.name == name)
            .ok_or_else(|| RuntimeError::UnknownCall {
                name: name.to_string(),
                known: self
                    .package
                    .info
                    .calls
                    .iter()
                    .map(|c| c.name.clone())
                    .collect(),
            })?;
        let call = self.package.info.calls[index].clone();
        // Check every input before touching the device.
        for t in &call.inputs {
            let given = inputs
                .get(&t.name)
                .ok_or_else(|| RuntimeError::MissingInput {
                    call: name.to_string(),
                    tensor: t.name.clone(),
                    expected: type_text(t),
                })?;
            if given.dtype() != t.dtype || given.shape().dims() != t.shape.as_slice() {
                return Err(RuntimeError::InputType {
                    call: name.to_string(),
                    tensor: t.name.clone(),
                    expected: type_text(t),
                    given: given.ty().to_string(),
                });
            }
        }
        if let Some(extra) = inputs
            .keys()
            .find(|k| !call.inputs.iter().any(|t| &t.name == *k))
        {
            return Err(RuntimeError::UnknownInput {
                call: name.to_string(),
                tensor: extra.clone(),
                known: call.inputs.iter().map(|t| t.name.clone()).collect(),
            });
        }
        let command = index as u32
            | if checkpoints.is_some() {
                CHECKPOINT_FLAG
            } else {
                0
            };
        tracing::info!(
            call = name,
            command,
            phases = call.phases.len(),
            checkpoints = checkpoints.is_some(),
            "invoking streaming host exchange call"
        );
        let first_step = self.device.steps().len();
        let cycles_before = self.device.cycles();

        let clock = self.device.clock_hz();
        let mut bytes_in = self.write_inputs(&call, inputs, 0)?;
        let word = command.to_le_bytes();
        for tile in 0..self.package.info.tile_count {
            self.device
                .write(tile, self.package.info.host.command_address, &word)?;
            bytes_in += 4;
        }
        self.charge(bytes_in);
        // The bar counts from where the inputs' host-link cycles end, as
        // the estimate (and `device_cycles`) do.
        let _watch = self.progress.as_ref().map(|(hook, estimates)| {
            Watch::start(
                hook,
                CallStart {
                    call: name,
                    start: cycles_before + ipu_arch::host_transfer_cycles(bytes_in, clock),
                    estimated: estimates.get(name).copied(),
                    reached: self.device.progress(),
                },
            )
        });
        // Host stops come first: at each the host writes the stop's inputs
        // (a device loop's next weights) and resumes the device, which
        // waits for them, so their transfer counts in the device cycles.
        let mut host_stream_cycles = 0;
        for stop in 1..=call.host_stops {
            match self.device.run()? {
                DeviceStop::HostSync => {}
                DeviceStop::Exited => {
                    self.finished = true;
                    return Err(RuntimeError::Protocol(format!(
                        "the device exited during call `{name}` at host stop {stop} of {}",
                        call.host_stops
                    )));
                }
            }
            let moved = self.write_inputs(&call, inputs, stop)?;
            self.charge(moved);
            host_stream_cycles += ipu_arch::host_transfer_cycles(moved, clock);
        }
        let stops = checkpoints.map_or(0, |(c, _)| c.stops);
        let mut values = BTreeMap::new();
        for stop in 1..=stops + 1 {
            match self.device.run()? {
                DeviceStop::HostSync => {}
                DeviceStop::Exited => {
                    self.finished = true;
                    return Err(RuntimeError::Protocol(format!(
                        "the device exited during call `{name}` (at stop {stop} of {}) instead of \
                         stopping at a host sync",
                        stops + 1
                    )));
                }
            }
            if let Some((cp, graph)) = checkpoints {
                let mut moved = 0;
                for v in cp.values.iter().filter(|v| v.stop == stop) {
                    let id = graph.lookup(&v.value).expect("checked when parsed");
                    let ty = graph.value(id).ty.clone();
                    let (t, m) = self.read_value(
                        (&v.placements, v.transposed),
                        &ty,
                        &format!("checkpoint value `{}`", v.value),
                    )?;
                    moved += m;
                    values.insert(v.value.clone(), t);
                }
                self.charge(moved);
            }
        }
        let after = self.device.cycles();
        let mut outputs = BTreeMap::new();
        let mut bytes_out = 0;
        for t in &call.outputs {
            let ty = TensorType::new(t.dtype, t.shape.clone());
            let (tensor, m) = self.read_value(
                (&t.placements, t.transposed),
                &ty,
                &format!("call `{name}` output `{}`", t.name),
            )?;
            bytes_out += m;
            outputs.insert(t.name.clone(), tensor);
        }
        self.charge(bytes_out);
        let host_in_cycles = ipu_arch::host_transfer_cycles(bytes_in, clock);
        let cycles = CallCycles {
            call: name.to_string(),
            checkpoint: checkpoints.is_some(),
            device_cycles: (after - cycles_before).saturating_sub(host_in_cycles),
            host_in_cycles,
            host_stream_cycles,
            host_out_cycles: ipu_arch::host_transfer_cycles(bytes_out, clock),
            first_step,
            end_step: self.device.steps().len(),
        };
        tracing::info!(
            call = name,
            device_cycles = cycles.device_cycles,
            host_in_cycles = cycles.host_in_cycles,
            host_stream_cycles = cycles.host_stream_cycles,
            host_out_cycles = cycles.host_out_cycles,
            bsp_steps = cycles.steps(),
            "streaming host exchange call finished"
        );
        self.calls.push(cycles.clone());
        Ok(CallOutput {
            outputs,
            checkpoints: values,
            cycles,
        })
    }

    /// Ends the session: writes the exit command and runs until every tile exits.
    pub fn close(mut self) -> Result<(), RuntimeError> {
        self.finish()
    }

    fn finish(&mut self) -> Result<(), RuntimeError> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        let word = EXIT_COMMAND.to_le_bytes();
        for tile in 0..self.package.info.tile_count {
            self.device
                .write(tile, self.package.info.host.command_address, &word)?;
        }
        self.charge(4 * self.package.info.tile_count as u64);
        match self.device.run()? {
            DeviceStop::Exited => {
                tracing::info!(cycles = self.device.cycles(), "host exchange session ended");
                Ok(())
            }
            DeviceStop::HostSync => Err(RuntimeError::Protocol(
                "the device stopped at a host sync after the exit command instead of exiting"
                    .to_string(),
            )),
        }
    }
}
