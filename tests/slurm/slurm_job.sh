#!/usr/bin/env bash
# A single-node Slurm cluster of this host, started for the test and stopped after it: munged,
# slurmctld and slurmd from Debian's slurm-wlm and munge, with a slurm.conf generated for this host
# and ports, everything under one temporary folder. It submits the project's own
# samples/slurm/mnist_convnet.sbatch unchanged; only what a site would set differently on the
# command line (one node of this host's cores, the binary's folder, one epoch for the trainer)
# differs from the file. Each job must train 2 ranks to the end and show they found each other
# ("2 ranks (BACKEND)"). The jobs:
#   mpi          the MPI backend, srun --mpi=pmi2 (MPICH's binary)
#   tcp          COLTRAIN_BACKEND=tcp: ranks and rank 0's host from SLURM_* variables
#   mpi-pmix     the MPI backend, SLURM_MPI_TYPE=pmix (Open MPI's binary)
#   torch:PYTHON samples/slurm/torch_ddp.sbatch, unchanged too, running tests/torch/launch_check.py
#                with PYTHON (which has coltrain_torch): coltrain_torch.init_process_group() takes
#                its ranks from srun's variables, and each rank checks an allreduce
#
# usage: slurm_job.sh SAMPLE_BINARY SOURCE_DIR WORK_DIR [JOB...]   (default: mpi tcp)
# Exit 77 (CTest: skipped) where it cannot run: not root, or Slurm or munge not installed.
set -euo pipefail
binary=$1 source_dir=$2 work=$3
shift 3
jobs=("$@")
[ ${#jobs[@]} -gt 0 ] || jobs=(mpi tcp)
skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "starting slurmd needs root"
for program in munged slurmctld slurmd sbatch squeue scontrol; do
  command -v "$program" >/dev/null 2>&1 || skip "$program is not installed (Debian: slurm-wlm munge)"
done

rm -rf "$work"
mkdir -p "$work"/{munge,state,spool,log,job}
chmod 700 "$work/munge"
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# munge: a fresh key, its socket in the work folder (so a munged of the host, if any, is untouched).
dd if=/dev/urandom of="$work/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$work/munge/munge.key"
socket="$work/munge/munge.socket"
munged --force --key-file="$work/munge/munge.key" --socket="$socket" \
  --pid-file="$work/munge/munged.pid" --log-file="$work/log/munged.log" \
  --seed-file="$work/munge/munge.seed"
for _ in $(seq 50); do [ -S "$socket" ] && break; sleep 0.1; done
[ -S "$socket" ] || { cat "$work/log/munged.log"; echo "munged did not start"; exit 1; }
pids+=("$(cat "$work/munge/munged.pid")")

host=$(hostname)
cores=$(nproc)
memory=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
cat >"$work/slurm.conf" <<CONF
ClusterName=coltrain-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
AuthType=auth/munge
AuthInfo=socket=$socket
CredType=cred/munge
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool/%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
NodeName=$host CPUs=$cores RealMemory=$memory State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=30 State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld -i -f "$SLURM_CONF"
for _ in $(seq 100); do [ -s "$work/slurmctld.pid" ] && break; sleep 0.1; done
pids+=("$(cat "$work/slurmctld.pid")")
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do [ -s "$work/slurmd.pid" ] && break; sleep 0.1; done
pids+=("$(cat "$work/slurmd.pid")")
for _ in $(seq 100); do
  state=$(sinfo -h -N -o %T 2>/dev/null || true)
  [ "$state" = idle ] && break
  sleep 0.2
done
[ "$state" = idle ] || { tail -20 "$work"/log/*.log; echo "the node is '$state', not idle"; exit 1; }

# The job's folder: the binary where the script expects it (./mnist_convnet), the data through
# COLTRAIN_DATA_DIR.
ln -s "$binary" "$work/job/mnist_convnet"
export COLTRAIN_DATA_DIR="$source_dir/data/mnist"
# Submits a job on one node of 2 tasks and waits for it: name, extra environment (NAME=value or
# nothing), the batch script and its arguments. Prints the job's output; exits if it did not
# complete. Sets `output` to the output file.
submit() {
  local name=$1 extra=$2 id state
  shift 2
  id=$(cd "$work/job" && sbatch --parsable --nodes=1 --ntasks-per-node=2 --cpus-per-task=1 \
         --time=10 --output="$work/job/$name-%j.out" --export="ALL${extra:+,$extra}" "$@")
  echo "job $name: $id"
  for _ in $(seq 720); do  # at most 6 minutes
    state=$(scontrol show job "$id" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p')
    case "$state" in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) break ;; esac
    sleep 0.5
  done
  output="$work/job/$name-$id.out"
  echo "---- $name: $state; its output:"
  cat "$output"
  [ "$state" = COMPLETED ] || { echo "job $name ended $state"; exit 1; }
}
# One epoch (2.4 s on 2 ranks here; the script's own 15 with a target of 0.97 stop after the fifth):
# what is tested is the launch, and the arguments the script passes on. The first epoch reaches
# 0.948 with the sample's seed; the script exits 2 below the target.
run_job() {  # name, the backend it must report, extra environment (NAME=value or nothing)
  local name=$1 backend=$2
  submit "$name" "$3" "$source_dir/samples/slurm/mnist_convnet.sbatch" --epochs 1 \
    --target-accuracy 0.9
  grep -q "2 ranks ($backend)" "$output" ||
    { echo "job $name: the ranks did not find each other (no '2 ranks ($backend)')"; exit 1; }
  grep -q "^epoch: 01/01 " "$output" ||
    { echo "job $name: the script did not pass --epochs 1 on (no 'epoch: 01/01')"; exit 1; }
}
# PyTorch's store on a fixed port outside the ephemeral range (as the other torch tests' ports).
run_torch_job() {  # the Python that has coltrain_torch
  submit torch "PYTHON=$1,MASTER_PORT=29662" "$source_dir/samples/slurm/torch_ddp.sbatch" \
    "$source_dir/tests/torch/launch_check.py" --expect-launcher-variables
  for rank in 0 1; do
    grep -q "^rank $rank of 2 (local rank $rank, launcher 2 ranks): allreduce exact" "$output" ||
      { echo "job torch: rank $rank did not report an exact allreduce over 2 ranks"; exit 1; }
  done
}
for job in "${jobs[@]}"; do
  case "$job" in
    mpi) run_job mpi mpi "" ;;
    tcp) run_job tcp tcp "COLTRAIN_BACKEND=tcp" ;;
    mpi-pmix) run_job mpi-pmix mpi "SLURM_MPI_TYPE=pmix" ;;
    torch:*) run_torch_job "${job#torch:}" ;;
    *) echo "slurm_job.sh: unknown job '$job'"; exit 2 ;;
  esac
done
echo "Slurm jobs ran on 2 ranks: ${jobs[*]}"
