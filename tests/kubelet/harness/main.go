// Command harness runs the kubelet's own device manager (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager)
// without a kubelet, as the real peer of a device plugin in tests. It serves the Registration
// service on the fixed path /var/lib/kubelet/device-plugins/kubelet.sock (run it as root), and
// optionally the kubelet's pod-resources API (v1) on a socket the test names.
//
// It is driven over stdin/stdout, one JSON object per line each way:
//
//	{"cmd":"start"}                         start a device manager (reads its checkpoint)
//	{"cmd":"capacity"}                      {"capacity":{res:n},"allocatable":{res:n},"inactive":[res]}
//	{"cmd":"allocate","pod":{...}}          admit a pod (see podSpec): Allocate every container in
//	                                        kubelet order, then {"containers":[{"name","envs","mounts","devices"}]}
//	{"cmd":"remove","uid":"..."}            the pod is no longer active
//	{"cmd":"podresources","socket":"/p"}    serve the pod-resources API on that unix socket
//	{"cmd":"stop"}                          stop the device manager (the registration socket goes away)
//	{"cmd":"restart"}                       stop, then start a fresh manager: a kubelet restart
//	{"cmd":"quit"}
//
// Every answer has "ok" (bool) and, when not ok, "error". Logs go to stderr.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"

	"google.golang.org/grpc"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
)

type containerSpec struct {
	Name   string           `json:"name"`
	Limits map[string]int64 `json:"limits"`
	// "Always" on an init container makes it a sidecar (a restartable init container).
	RestartPolicy string `json:"restartPolicy,omitempty"`
}

type podSpec struct {
	Namespace      string          `json:"namespace"`
	Name           string          `json:"name"`
	UID            string          `json:"uid"`
	InitContainers []containerSpec `json:"initContainers"`
	Containers     []containerSpec `json:"containers"`
}

type command struct {
	Cmd    string   `json:"cmd"`
	Pod    *podSpec `json:"pod,omitempty"`
	UID    string   `json:"uid,omitempty"`
	Socket string   `json:"socket,omitempty"`
}

type mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

type containerResult struct {
	Name    string              `json:"name"`
	Envs    map[string]string   `json:"envs"`
	Mounts  []mount             `json:"mounts"`
	Devices map[string][]string `json:"devices"`
}

type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

// harness owns the current device manager and the pods the test has admitted.
type harness struct {
	mu      sync.Mutex
	manager *devicemanager.ManagerImpl
	pods    []*v1.Pod
	logger  klog.Logger
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*v1.Pod(nil), h.pods...)
}

func (h *harness) current() *devicemanager.ManagerImpl {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.manager
}

func (h *harness) start() error {
	if h.current() != nil {
		return errors.New("already started")
	}
	m, err := devicemanager.NewManagerImpl(nil, topologymanager.NewFakeManager())
	if err != nil {
		return err
	}
	if err := m.Start(h.logger, h.activePods, sourcesReady{}, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return err
	}
	h.mu.Lock()
	h.manager = m
	h.mu.Unlock()
	return nil
}

func (h *harness) stop() error {
	m := h.current()
	if m == nil {
		return nil
	}
	h.mu.Lock()
	h.manager = nil
	h.mu.Unlock()
	return m.Stop(h.logger)
}

func toPod(spec *podSpec) *v1.Pod {
	build := func(cs []containerSpec) []v1.Container {
		out := make([]v1.Container, 0, len(cs))
		for _, c := range cs {
			limits := v1.ResourceList{}
			for name, n := range c.Limits {
				limits[v1.ResourceName(name)] = *resource.NewQuantity(n, resource.DecimalSI)
			}
			container := v1.Container{Name: c.Name, Resources: v1.ResourceRequirements{Limits: limits, Requests: limits}}
			if c.RestartPolicy != "" {
				policy := v1.ContainerRestartPolicy(c.RestartPolicy)
				container.RestartPolicy = &policy
			}
			out = append(out, container)
		}
		return out
	}
	namespace := spec.Namespace
	if namespace == "" {
		namespace = "default"
	}
	return &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: spec.Name, UID: types.UID(spec.UID)},
		Spec:       v1.PodSpec{InitContainers: build(spec.InitContainers), Containers: build(spec.Containers)},
	}
}

func deviceIDs(instances devicemanager.ResourceDeviceInstances) map[string][]string {
	out := map[string][]string{}
	for res, devices := range instances {
		ids := make([]string, 0, len(devices))
		for id := range devices {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		out[res] = ids
	}
	return out
}

func (h *harness) allocate(spec *podSpec) (map[string]any, error) {
	m := h.current()
	if m == nil {
		return nil, errors.New("not started")
	}
	pod := toPod(spec)
	h.mu.Lock()
	h.pods = append(h.pods, pod)
	h.mu.Unlock()
	all := append(append([]v1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...)
	for i := range all {
		if err := m.Allocate(pod, &all[i]); err != nil {
			return nil, fmt.Errorf("allocate container %s: %w", all[i].Name, err)
		}
	}
	results := make([]containerResult, 0, len(all))
	for i := range all {
		opts, err := m.GetDeviceRunContainerOptions(context.Background(), pod, &all[i])
		if err != nil {
			return nil, fmt.Errorf("run options of container %s: %w", all[i].Name, err)
		}
		r := containerResult{Name: all[i].Name, Envs: map[string]string{}, Mounts: []mount{}}
		if opts != nil {
			for _, e := range opts.Envs {
				r.Envs[e.Name] = e.Value
			}
			for _, mt := range opts.Mounts {
				r.Mounts = append(r.Mounts, mount{mt.ContainerPath, mt.HostPath, mt.ReadOnly})
			}
		}
		r.Devices = deviceIDs(m.GetDevices(string(pod.UID), all[i].Name))
		results = append(results, r)
	}
	return map[string]any{"containers": results}, nil
}

func (h *harness) remove(uid string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	kept := h.pods[:0]
	for _, p := range h.pods {
		if string(p.UID) != uid {
			kept = append(kept, p)
		}
	}
	h.pods = kept
}

func (h *harness) capacity() (map[string]any, error) {
	m := h.current()
	if m == nil {
		return nil, errors.New("not started")
	}
	capacity, allocatable, inactive := m.GetCapacity()
	count := func(list v1.ResourceList) map[string]int64 {
		out := map[string]int64{}
		for name, q := range list {
			out[string(name)] = q.Value()
		}
		return out
	}
	sort.Strings(inactive)
	return map[string]any{"capacity": count(capacity), "allocatable": count(allocatable), "inactive": inactive}, nil
}

// providers of the pod-resources server: pods from the harness, devices from the current manager.
type podsProvider struct{ h *harness }

func (p podsProvider) GetActivePods() []*v1.Pod { return p.h.activePods() }
func (p podsProvider) GetPods() []*v1.Pod       { return p.h.activePods() }
func (p podsProvider) GetPodByName(namespace, name string) (*v1.Pod, bool) {
	for _, pod := range p.h.activePods() {
		if pod.Namespace == namespace && pod.Name == name {
			return pod, true
		}
	}
	return nil, false
}

type devicesProvider struct{ h *harness }

func containerDevices(instances devicemanager.ResourceDeviceInstances) []*podresourcesapi.ContainerDevices {
	ids := deviceIDs(instances)
	names := make([]string, 0, len(ids))
	for res := range ids {
		names = append(names, res)
	}
	sort.Strings(names)
	out := make([]*podresourcesapi.ContainerDevices, 0, len(names))
	for _, res := range names {
		out = append(out, &podresourcesapi.ContainerDevices{ResourceName: res, DeviceIds: ids[res]})
	}
	return out
}

func (d devicesProvider) UpdateAllocatedDevices() {
	if m := d.h.current(); m != nil {
		m.UpdateAllocatedDevices()
	}
}

func (d devicesProvider) GetDevices(podUID, containerName string) []*podresourcesapi.ContainerDevices {
	if m := d.h.current(); m != nil {
		return containerDevices(m.GetDevices(podUID, containerName))
	}
	return nil
}

func (d devicesProvider) GetAllocatableDevices() []*podresourcesapi.ContainerDevices {
	if m := d.h.current(); m != nil {
		return containerDevices(m.GetAllocatableDevices())
	}
	return nil
}

type noCPUs struct{}

func (noCPUs) GetCPUs(string, string) []int64 { return nil }
func (noCPUs) GetAllocatableCPUs() []int64    { return nil }

type noMemory struct{}

func (noMemory) GetMemory(string, string) []*podresourcesapi.ContainerMemory { return nil }
func (noMemory) GetAllocatableMemory() []*podresourcesapi.ContainerMemory    { return nil }

type noDynamicResources struct{}

func (noDynamicResources) GetDynamicResources(*v1.Pod, *v1.Container) []*podresourcesapi.DynamicResource {
	return nil
}

func (h *harness) servePodResources(socket string) error {
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket)
	if err != nil {
		return err
	}
	server := grpc.NewServer()
	providers := podresources.PodResourcesProviders{
		Pods:             podsProvider{h},
		Devices:          devicesProvider{h},
		Cpus:             noCPUs{},
		Memory:           noMemory{},
		DynamicResources: noDynamicResources{},
	}
	podresourcesapi.RegisterPodResourcesListerServer(server, podresources.NewV1PodResourcesServer(context.Background(), providers))
	go func() { _ = server.Serve(listener) }()
	return nil
}

func (h *harness) handle(c command) (map[string]any, error) {
	switch c.Cmd {
	case "start":
		return nil, h.start()
	case "stop":
		return nil, h.stop()
	case "restart":
		if err := h.stop(); err != nil {
			return nil, err
		}
		return nil, h.start()
	case "capacity":
		return h.capacity()
	case "allocate":
		if c.Pod == nil {
			return nil, errors.New("allocate needs a pod")
		}
		return h.allocate(c.Pod)
	case "remove":
		h.remove(c.UID)
		return nil, nil
	case "podresources":
		return nil, h.servePodResources(c.Socket)
	default:
		return nil, fmt.Errorf("unknown command %q", c.Cmd)
	}
}

func main() {
	klog.SetOutput(os.Stderr)
	h := &harness{logger: klog.Background()}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var c command
		answer := map[string]any{}
		err := json.Unmarshal(in.Bytes(), &c)
		if err == nil && c.Cmd == "quit" {
			_ = h.stop()
			_ = out.Encode(map[string]any{"ok": true})
			return
		}
		if err == nil {
			var result map[string]any
			result, err = h.handle(c)
			for k, v := range result {
				answer[k] = v
			}
		}
		answer["ok"] = err == nil
		if err != nil {
			answer["error"] = err.Error()
		}
		if encodeErr := out.Encode(answer); encodeErr != nil {
			fmt.Fprintln(os.Stderr, "harness: cannot write answer:", encodeErr)
			return
		}
	}
	_ = h.stop()
}
