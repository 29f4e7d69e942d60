package sandbox

import "fmt"

// Unit files and configuration the machines run from, in the shape
// kubeadm and Debian give them.

const sshdConfig = `# kubelift sandbox node: keys only, root by key, no PAM.
ListenAddress %s
Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PrintMotd no
PidFile /run/sshd.pid
Subsystem sftp /usr/lib/openssh/sftp-server
`

const sshUnit = `[Unit]
Description=OpenBSD Secure Shell server

[Service]
ExecStart=/usr/sbin/sshd -D -e -f /etc/ssh/sshd_config
RuntimeDirectory=sshd
Restart=on-failure

[Install]
WantedBy=multi-user.target
`

const criUnit = `[Unit]
Description=Container runtime stand-in (CRI server from k8s.io/cri-client/pkg/fake; keeps containers as records)

[Service]
ExecStart=` + toolPath + ` cri --endpoint ` + criEndpoint + `
RuntimeDirectory=fake-cri
Restart=always
RestartSec=1

[Install]
WantedBy=multi-user.target
`

// kubeletUnit is kubeadm's kubelet.service with its drop-in folded in.
const kubeletUnit = `[Unit]
Description=kubelet: The Kubernetes Node Agent
After=containerd.service fake-cri.service

[Service]
Environment="KUBELET_KUBECONFIG_ARGS=--kubeconfig=/etc/kubernetes/kubelet.conf"
Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"
EnvironmentFile=-/var/lib/kubelet/kubelet-flags.env
ExecStart=/usr/local/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS $KUBELET_ARGS
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// kubeletConfigCommon is every node's kubelet configuration but for the
// runtime's part (kubeletConfigStandIn, kubeletConfigContainerd).
// failCgroupV1: false lets kubelets from 1.35 start on this cgroup v1
// host (1.31-1.34 read it too; 1.30 ignores the field it does not know,
// with a warning, as its lenient decoding does).
const kubeletConfigCommon = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: Webhook}
podLogsDir: /var/log/pods
syncFrequency: 10s
nodeStatusUpdateFrequency: 4s
failSwapOn: false
cgroupDriver: cgroupfs
failCgroupV1: false
`

// kubeletConfigStandIn works without cgroup management (the runtime is a
// stand-in): no QoS cgroups, no node allocatable enforcement, no eviction.
const kubeletConfigStandIn = `containerRuntimeEndpoint: %s
cgroupsPerQOS: false
enforceNodeAllocatable: []
evictionHard: {}
localStorageCapacityIsolation: false
`

// kubeProxyUnit runs kube-proxy as a host unit, as binary-deployed
// clusters do (kubeadm's runs it as a DaemonSet).
const kubeProxyUnit = `[Unit]
Description=Kubernetes Kube Proxy (iptables mode)
After=network-online.target

[Service]
ExecStart=/usr/local/bin/kube-proxy --config=/etc/kubernetes/kube-proxy.yaml
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// kubeProxyConfig: iptables mode; traffic to a ClusterIP from outside
// the pod network (a node, the admin machine) is masqueraded;
// conntrack.maxPerCore 0 leaves nf_conntrack_max alone (read-only outside
// the host's network namespace); metrics and health on loopback only.
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: /etc/kubernetes/kube-proxy.conf
hostnameOverride: %s
bindAddress: %s
clusterCIDR: %s
mode: iptables
iptables:
  minSyncPeriod: 1s
conntrack:
  maxPerCore: 0
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
`

// etcdUnit is Debian's etcd, alone on cp-1, where the sandbox runs no
// etcd of a chosen version (Config.Etcd; etcdMemberUnit).
const etcdUnit = `[Unit]
Description=etcd (Debian etcd-server)

[Service]
ExecStart=/usr/bin/etcd --name %[1]s --data-dir /var/lib/etcd \
  --listen-client-urls http://%[2]s:2379,http://127.0.0.1:2379 --advertise-client-urls http://%[2]s:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster %[1]s=http://127.0.0.1:2380 --log-level warn
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// apiserverUnit: DefaultTolerationSeconds is off, as on clusters whose
// pods predate it, so pods keep exactly the tolerations they were given.
// %[3]s is more flags (" --feature-gates=..."), or "".
const apiserverUnit = `[Unit]
Description=Kubernetes API Server
After=etcd.service

[Service]
ExecStart=/usr/local/bin/kube-apiserver \
  --advertise-address=%[1]s --bind-address=%[1]s --secure-port=6443 \
  --etcd-servers=%[2]s \
  --tls-cert-file=/etc/kubernetes/pki/apiserver.crt --tls-private-key-file=/etc/kubernetes/pki/apiserver.key \
  --client-ca-file=/etc/kubernetes/pki/ca.crt \
  --kubelet-client-certificate=/etc/kubernetes/pki/apiserver-kubelet-client.crt \
  --kubelet-client-key=/etc/kubernetes/pki/apiserver-kubelet-client.key \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-key-file=/etc/kubernetes/pki/sa.pub \
  --service-account-signing-key-file=/etc/kubernetes/pki/sa.key \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-cluster-ip-range=10.96.0.0/16 \
  --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction \
  --disable-admission-plugins=DefaultTolerationSeconds \
  --allow-privileged=true%[3]s
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// controllerManagerUnit: the node lifecycle controller looks every 2s and
// gives a silent kubelet NodeMonitorGracePeriod before NotReady and the
// NoExecute taints.
const controllerManagerUnit = `[Unit]
Description=Kubernetes Controller Manager
After=kube-apiserver.service

[Service]
ExecStart=/usr/local/bin/kube-controller-manager \
  --bind-address=%[1]s \
  --kubeconfig=/etc/kubernetes/controller-manager.conf \
  --authentication-kubeconfig=/etc/kubernetes/controller-manager.conf \
  --authorization-kubeconfig=/etc/kubernetes/controller-manager.conf \
  --root-ca-file=/etc/kubernetes/pki/ca.crt \
  --service-account-private-key-file=/etc/kubernetes/pki/sa.key \
  --use-service-account-credentials=true \
  --leader-elect=%[2]s \
  --node-monitor-period=2s --node-monitor-grace-period=%[3]s \
  --flex-volume-plugin-dir=/var/lib/kubelet/volume-plugins \
  --cluster-name=kubelift-sandbox
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

const schedulerUnit = `[Unit]
Description=Kubernetes Scheduler
After=kube-apiserver.service

[Service]
ExecStart=/usr/local/bin/kube-scheduler \
  --bind-address=%[1]s \
  --kubeconfig=/etc/kubernetes/scheduler.conf \
  --authentication-kubeconfig=/etc/kubernetes/scheduler.conf \
  --authorization-kubeconfig=/etc/kubernetes/scheduler.conf \
  --leader-elect=%[2]s
Restart=always
RestartSec=2

[Install]
WantedBy=multi-user.target
`

// registryConfig configures docker-registry on addr; the private one
// serves TLS and asks for the htpasswd user.
func registryConfig(addr, secret string, private bool) string {
	c := fmt.Sprintf(`version: 0.1
log:
  level: info
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: /var/lib/docker-registry
  delete:
    enabled: true
http:
  addr: %s
  secret: %s
`, addr, secret)
	if private {
		c += `  tls:
    certificate: /etc/docker/registry/tls.crt
    key: /etc/docker/registry/tls.key
auth:
  htpasswd:
    realm: kubelift-sandbox
    path: /etc/docker/registry/htpasswd
`
	}
	return c
}

// registryUnit runs docker-registry; %s says what it plays.
const registryUnit = `[Unit]
Description=Docker Registry (Debian docker-registry): %s

[Service]
ExecStart=/usr/bin/docker-registry serve /etc/docker/registry/config.yml
Restart=on-failure

[Install]
WantedBy=multi-user.target
`
