package activation

import "context"

// talos examines a Talos node: Talos writes /etc/cri/conf.d/hosts/<registry>/hosts.toml from
// its machine configuration and applies mirror changes live (containerd re-reads hosts.toml on
// every pull), so the files on disk are what the CRI containerd uses. The agent's gen pass only
// prints the machine-config patch there; applying it is the operator's step.
func (e *evaluator) talos(ctx context.Context) RuntimeReport {
	rep := RuntimeReport{Runtime: RuntimeTalos, Evidence: "live"}
	root := e.opts.TalosHostsDir
	e.add(RuntimeTalos, "live", Info, "Talos writes %s/<registry>/hosts.toml from the machine config; containerd re-reads them on every pull (no restart involved)", root)
	dir := root
	rep.LoadedConfigPath = &dir
	return e.judgeHosts(ctx, rep, RuntimeTalos, []string{root})
}
